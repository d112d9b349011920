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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from grpo.core.names import SAMPLER_ID_RULE, is_sampler_id
from grpo.runtime.refusals import note

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
    return _make(directory, [TRAINER, REWARD, *(f"sampler-{i}" for i in range(samplers))])


def add_samplers(directory: Path, sampler_ids: list[str]) -> list[Path]:
    """Key pairs for samplers joining a run whose keys `directory` holds: the running trainer
    reads authorized/ again when their keys connect (AuthorizedKeys)."""
    if not (directory / f"{TRAINER}.key").is_file():
        raise ValueError(f"{directory} holds no trainer key: make the run's keys first")
    if bad := [sid for sid in sampler_ids if not is_sampler_id(sid)]:
        raise ValueError(f"{bad[0]!r} is no sampler id ({SAMPLER_ID_RULE})")
    return _make(directory, sampler_ids)


def _make(directory: Path, names: list[str]) -> list[Path]:
    """A key pair for each of `names`, a copy of each sampler's public key in authorized/."""
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


class AuthorizedKeys:
    """The public keys in authorized/ and the sampler id each was made for (its file name, as
    `python -m grpo keys` writes it), as a ZAP callback that accepts those keys only. Read
    again whenever the key files changed (one added, deleted or overwritten in place), looked
    at for every unknown key and at most once every RECHECK_S for known ones: a sampler whose
    key is added during a run joins it without a restart (the pool grows, grpo.delivery.pool),
    one whose key is deleted is refused from then on, and a flood of unknown keys costs a
    listing of the directory each."""

    RECHECK_S = 1.0

    def __init__(self, directory: Path, clock: Callable[[], float] = time.monotonic):
        self.directory, self.refused, self.clock = directory, 0, clock
        self.read_files: tuple | None = None  # the key files' names, sizes and times, when read
        self.checked_at = clock()
        self._read(self._files(), strict=True)
        if not self.owners:
            raise ValueError(f"transport.curve_dir: no public keys in {directory}")

    def _files(self) -> tuple | None:
        """What tells the key files apart from how they were: names, sizes, change times."""
        try:
            stats = [(p.name, p.stat()) for p in self.directory.glob("*.key")]
        except OSError:
            return None
        return tuple(sorted((name, st.st_size, st.st_mtime_ns, st.st_ino) for name, st in stats))

    def _read(self, files: tuple | None, strict: bool = False) -> None:
        """The keys again; `files`: the key files as _files() saw them just before."""
        owners = {}
        for path in sorted(self.directory.glob("*.key")):
            try:
                public, _ = _load(path, "an authorised key")
            except (ValueError, OSError) as e:
                if strict:
                    raise
                log.warning("%s: left out", e)  # one bad file added later refuses only itself
                continue
            owners[public.decode()] = path.stem
        # Replaced whole: the authenticator's thread and the channel's read it.
        self.owners, self.read_files = owners, files

    def owner(self, public: str | None) -> str | None:
        """The sampler id `public` (Z85, as ZeroMQ reports a peer's User-Id) was made for."""
        if public is None:
            return None
        if public not in self.owners or self.clock() - self.checked_at >= self.RECHECK_S:
            self.checked_at = self.clock()
            if (files := self._files()) != self.read_files:
                self._read(files)
        return self.owners.get(public)

    def callback(self, domain: str, key: bytes) -> bool:
        if self.owner(key.decode(errors="replace")) is not None:
            return True
        self.refused += 1
        note(
            log,
            self.refused,
            "refused a peer with an unauthorised CURVE key %s... (%d refused so far)",
            key[:8].decode(errors="replace"),
            self.refused,
        )
        return False


class CurveAuthenticator(ThreadAuthenticator):
    """ZeroMQ's authenticator thread, with the keys it accepts (`keys`: whose each one is)."""

    keys: AuthorizedKeys


def server_keys(curve_dir: Path, owner: str = TRAINER) -> tuple[bytes, bytes, AuthorizedKeys]:
    """`owner`'s pair (the trainer's, or a relaying sampler's) and the keys it accepts;
    ValueError naming the file that is missing or unsafe."""
    whose = "the trainer's" if owner == TRAINER else f"sampler {owner}'s"
    public, secret = _load_pair(curve_dir / f"{owner}.key_secret", f"{whose} secret key")
    return public, secret, AuthorizedKeys(curve_dir / AUTHORIZED)


def secure_server(
    ctx: zmq.Context, sockets: list[zmq.Socket], curve_dir: Path, owner: str = TRAINER
) -> CurveAuthenticator:
    """Make `sockets` (before bind) CURVE servers with `owner`'s pair (the trainer's, or a
    relaying sampler's) that accept authorized/ keys only; returns the authenticator thread, to
    be stopped before the context is terminated."""
    public, secret, keys = server_keys(curve_dir, owner)
    auth = CurveAuthenticator(ctx)
    auth.keys = keys
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
    parser.add_argument(
        "--add", nargs="+", metavar="SAMPLER_ID", help="only these samplers' pairs (a run joined)"
    )
    args = parser.parse_args(argv)
    try:
        written = (
            add_samplers(args.directory, args.add)
            if args.add
            else generate(args.directory, args.samplers)
        )
    except ValueError as e:
        print(f"keys: {e}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    print(
        f"set transport.curve_dir={args.directory} on every node (see grpo/wire/keys.py for "
        "which files each node needs)"
    )
    return 0
