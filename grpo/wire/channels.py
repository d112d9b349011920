"""ZeroMQ channels between sampler and trainer, with heartbeats and timeouts: what both share.
(grpo.wire.trainer_channel and grpo.wire.sampler_channel are the two ends.)

    sampler PUSH ──episodes + heartbeats──▶ PULL trainer   (transport.episodes_addr, trainer binds)
    sampler SUB  ◀──heartbeats, done, stop── PUB trainer   (transport.control_addr, trainer binds)

Every trainer message carries its published version, its incarnation (new at each start, so a
sampler notices a restart) and its acknowledgements: per sampler, the batches its newest saved
state holds. They are cumulative, so a control message lost on the PUB socket costs nothing.

Each side runs a heartbeat thread with its own sockets (zmq sockets are not thread-safe), so a
peer busy generating or training for minutes still looks alive, and a dead one is noticed
within `peer_timeout_s`. Frames that fail to decode are logged, counted and dropped.
"""

from __future__ import annotations

import logging

import zmq

from grpo.runtime.lifetime import port_holders

log = logging.getLogger("grpo.transport")


class PeerError(RuntimeError):
    """The peer is gone, silent past its timeout, or asked us to stop; the message says which."""


def new_socket(ctx: zmq.Context, kind: int, linger_ms: int = 1000) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    return sock


HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def is_loopback(addr: str) -> bool:
    return addr.startswith(("tcp://127.", "tcp://localhost:", "tcp://[::1]", "ipc://", "inproc://"))


def bind(sock: zmq.Socket, addr: str, what: str) -> None:
    try:
        sock.bind(addr)
    except zmq.ZMQError as e:
        port = addr.rsplit(":", 1)[-1]
        holders = port_holders(int(port)) if port.isdigit() else []
        if holders:  # a trainer left from an earlier run: say which, or a sampler may join it
            raise PeerError(
                f"cannot bind the {what} socket to {addr}: the port is held by "
                f"{'; '.join(holders)}; stop that process, or change transport.* addresses"
            ) from None
        raise PeerError(
            f"cannot bind the {what} socket to {addr}: {e} (another run still using the port? "
            "change transport.* addresses)"
        ) from None
