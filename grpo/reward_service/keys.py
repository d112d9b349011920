"""The reward service's own CURVE key pair, so that a reward node never holds the trainer's.

With ``transport.curve_dir``, the service (ROLE=reward) serves with ``reward.key_secret`` and
accepts the samplers' keys in ``authorized/``, as the trainer does; a sampler connects to it
with its own pair and insists on ``reward.key``. Copy to the reward node: reward.key_secret
and authorized/; to each sampler's node: reward.key, besides what grpo/wire/keys.py lists.

`python -m grpo keys DIR` makes the pair with the others.
"""

from __future__ import annotations

from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

# The loading helpers of grpo.wire.keys, so that its checks on key files hold here too.
from grpo.wire.keys import AUTHORIZED, REWARD, AuthorizedKeys, ClientKeys, _load, _load_pair

__all__ = ["client_keys", "secure_reward_server"]


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
    keys = AuthorizedKeys(curve_dir / AUTHORIZED)
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
