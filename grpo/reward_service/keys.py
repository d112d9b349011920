"""The reward service's own CURVE key pair, so that a reward node never holds the trainer's.

With ``transport.curve_dir``, the service (ROLE=reward) serves with ``reward.key_secret`` and
accepts the samplers' keys in ``authorized/``, as the trainer does; a sampler connects to it
with its own pair and insists on ``reward.key``. Copy to the reward node: reward.key_secret
and authorized/; to each sampler's node: reward.key, besides what grpo/wire/keys.py lists.

`python -m grpo.reward_service.keys DIR` adds the pair to a key directory that
`python -m grpo keys DIR` made.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

# The loading helpers of grpo.wire.keys, so that its checks on key files hold here too.
from grpo.wire.keys import AUTHORIZED, ClientKeys, _AuthorizedKeys, _load, _load_pair

__all__ = ["REWARD", "client_keys", "generate", "secure_reward_server"]

REWARD = "reward"


def generate(directory: Path) -> list[Path]:
    """reward.key and reward.key_secret (readable by its owner only) in `directory`; refuses to
    overwrite an existing pair."""
    secret = directory / f"{REWARD}.key_secret"
    if secret.exists() or (directory / f"{REWARD}.key").exists():
        raise ValueError(f"{secret} exists; remove it or choose another directory")
    directory.mkdir(parents=True, exist_ok=True)
    public_path, secret_path = zmq.auth.create_certificates(directory, REWARD)
    os.chmod(secret_path, 0o600)
    return [Path(public_path), Path(secret_path)]


def secure_reward_server(
    ctx: zmq.Context, sock: zmq.Socket, curve_dir: Path
) -> ThreadAuthenticator:
    """Make `sock` (before bind) a CURVE server with the service's own pair that accepts the
    keys in authorized/; returns the authenticator thread, to be stopped before the context is
    terminated."""
    public, secret = _load_pair(
        curve_dir / f"{REWARD}.key_secret",
        "the reward service's secret key (python -m grpo.reward_service.keys DIR makes it)",
    )
    keys = _AuthorizedKeys(curve_dir / AUTHORIZED)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=keys)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth


def client_keys(curve_dir: Path, sampler_id: str) -> ClientKeys:
    """A sampler's pair, with the reward service's public key as the server's it insists on."""
    public, secret = _load_pair(
        curve_dir / f"{sampler_id}.key_secret", f"sampler {sampler_id}'s secret key"
    )
    service, _ = _load(curve_dir / f"{REWARD}.key", "the reward service's public key")
    return ClientKeys(public, secret, service)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m grpo.reward_service.keys DIR", file=sys.stderr)
        return 2
    try:
        written = generate(Path(argv[0]))
    except (OSError, ValueError) as e:
        print(f"keys: {e}", file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
