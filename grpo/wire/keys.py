"""ZeroMQ CURVE keys: authentication and encryption between trainer and samplers.

`python -m grpo keys DIR [--samplers N]` writes:

    DIR/trainer.key, DIR/trainer.key_secret          the trainer's pair
    DIR/reward.key, DIR/reward.key_secret            the reward service's (grpo.reward_service)
    DIR/sampler-<i>.key, DIR/sampler-<i>.key_secret  one pair per sampler (named by sampler_id)
    DIR/authorized/sampler-<i>.key                   the public keys the trainer accepts

Copy to the trainer's node: trainer.key_secret and authorized/; to a sampler's node: its own
sampler-<i>.key_secret, trainer.key and reward.key, and with weights.mode: stream and several
samplers authorized/ too (samplers relay versions to each other: each serves with its own pair
and accepts, and insists on, the others' keys); to a reward node: reward.key_secret and
authorized/. Set transport.curve_dir to that directory on each node.
A peer whose key is not in authorized/ (or that speaks no CURVE) is refused and logged.
Secret keys are written 0600, and one that group or others can read is refused at load.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("grpo.transport")

TRAINER = "trainer"
REWARD = "reward"  # the reward service's pair: a reward node never holds the trainer's
AUTHORIZED = "authorized"


def _load(path: Path, what: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from a key file ZeroMQ wrote."""
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"transport.curve_dir: cannot read {what} from {path} ({e}); "
            "make keys with `python -m grpo keys DIR`"
        ) from None


def _private(path: Path) -> None:
    """Refuse a secret key that users other than its owner can read: whoever reads it can
    speak as its owner (send batches as that sampler, or pose as the trainer)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # _load says what is wrong with a missing file
    if mode & 0o044:
        raise ValueError(
            f"transport.curve_dir: {path} is readable by group or others (mode "
            f"{mode & 0o777:04o}); run chmod 600 {path}"
        )


def _load_pair(path: Path, what: str) -> tuple[bytes, bytes]:
    _private(path)
    public, secret = _load(path, what)
    if secret is None:
        raise ValueError(f"transport.curve_dir: {path} holds no secret key ({what})")
    return public, secret


def generate(directory: Path, samplers: int) -> list[Path]:
    """Key pairs for the trainer, the reward service and `samplers` samplers; refuses to
    overwrite existing ones."""
    names = [TRAINER, REWARD, *(f"sampler-{i}" for i in range(samplers))]
    existing = [directory / f"{n}.key_secret" for n in names if (directory / f"{n}.key").exists()]
    if existing:
        raise ValueError(f"{existing[0]} exists; remove it or choose another directory")
    (directory / AUTHORIZED).mkdir(parents=True, exist_ok=True)
    written = []
    # ZeroMQ writes the files under the umask (0644 by default): created 0600 from the start,
    # a secret is never readable by others, not even for a moment.
    old_umask = os.umask(0o077)
    try:
        certificates = [zmq.auth.create_certificates(directory, name) for name in names]
    finally:
        os.umask(old_umask)
    for name, (public, secret) in zip(names, certificates, strict=True):
        Path(public).chmod(0o644)  # public keys are meant to be copied
        written += [Path(public), Path(secret)]
        if name not in (TRAINER, REWARD):
            shutil.copy(public, directory / AUTHORIZED / f"{name}.key")
    return written


def authorized_names(curve_dir: Path) -> dict[str, str]:
    """Each authorised public key (Z85, as ZeroMQ reports a peer's User-Id) -> the sampler id it
    was made for: its file name in authorized/ (`python -m grpo keys` names them so)."""
    names = {}
    for path in sorted((curve_dir / AUTHORIZED).glob("*.key")):
        public, _ = _load(path, "an authorised key")
        names[public.decode()] = path.stem
    return names


class _AuthorizedKeys:
    """ZAP callback: accept the keys in authorized/, log every refusal."""

    def __init__(self, directory: Path):
        self.keys = set()
        for path in sorted(directory.glob("*.key")):
            public, _ = zmq.auth.load_certificate(path)
            self.keys.add(public)
        if not self.keys:
            raise ValueError(f"transport.curve_dir: no public keys in {directory}")
        self.refused = 0

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        self.refused += 1
        log.warning(
            "refused a peer with an unauthorised CURVE key %s... (%d refused so far)",
            key[:8].decode(errors="replace"),
            self.refused,
        )
        return False


def secure_server(
    ctx: zmq.Context, sockets: list[zmq.Socket], curve_dir: Path, owner: str = TRAINER
) -> ThreadAuthenticator:
    """Make `sockets` (before bind) CURVE servers with `owner`'s pair (the trainer's, or a
    relaying sampler's) that accept authorized/ keys only; returns the authenticator thread, to
    be stopped before the context is terminated."""
    whose = "the trainer's" if owner == TRAINER else f"sampler {owner}'s"
    public, secret = _load_pair(curve_dir / f"{owner}.key_secret", f"{whose} secret key")
    keys = _AuthorizedKeys(curve_dir / AUTHORIZED)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=keys)
    for sock in sockets:
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True
    return auth


@dataclass(frozen=True)
class ClientKeys:
    """A sampler's pair and the trainer's public key, which it insists on."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, curve_dir: Path, sampler_id: str) -> ClientKeys:
        path = curve_dir / f"{sampler_id}.key_secret"
        public, secret = _load_pair(path, f"sampler {sampler_id}'s secret key")
        server_public, _ = _load(curve_dir / f"{TRAINER}.key", "the trainer's public key")
        return cls(public, secret, server_public)

    def apply(self, sock: zmq.Socket, server_public: bytes | None = None) -> None:
        """Before connect; `server_public`: another server's key than the trainer's (a relay's,
        relay_key)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = server_public or self.server_public


def relay_key(curve_dir: Path, sampler_id: str) -> bytes:
    """The public key sampler `sampler_id` serves its relay with (its authorized/ key)."""
    public, _ = _load(curve_dir / AUTHORIZED / f"{sampler_id}.key", f"{sampler_id}'s public key")
    return public


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo keys", description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--samplers", type=int, default=1, help="sampler key pairs to make")
    args = parser.parse_args(argv)
    try:
        written = generate(args.directory, args.samplers)
    except ValueError as e:
        print(f"keys: {e}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    print(f"set transport.curve_dir={args.directory} on every node (see grpo/wire/keys.py for "
          "which files each node needs)")  # fmt: skip
    return 0
