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
from collections.abc import Mapping
from dataclasses import dataclass

import zmq

from grpo.config import TransportConfig
from grpo.runtime.lifetime import port_holders

log = logging.getLogger("grpo.transport")

# What one peer's queue may hold when transport.receive_hwm is left 0: the mark is this over
# the largest message, kept between a pair (a smaller one stalls a sender on every message)
# and ZeroMQ's own default. Messages past it wait in the sender's queue, not in ours: a real
# sampler sends a few batches ahead at most, and a flood then costs its sender the memory
# (bench/hostile.py measured +600 MiB for a trainer at 4 GiB, before this was lowered).
RECEIVE_QUEUE_BYTES = 256 << 20
_HWM_RANGE = (2, 1000)


class PeerError(RuntimeError):
    """The peer is gone, silent past its timeout, or asked us to stop; the message says which."""


@dataclass(frozen=True)
class SocketLimits:
    """What ZeroMQ may buffer for one connection of a socket before our code sees a byte:
    no message part over `max_message_bytes` (ZMQ_MAXMSGSIZE: a larger one drops the
    connection before it is buffered), at most `receive_hwm` whole messages queued (ZMQ_RCVHWM:
    beyond it ZeroMQ stops reading from that peer, whose sends then wait)."""

    max_message_bytes: int
    receive_hwm: int

    @classmethod
    def of(cls, cfg: TransportConfig, max_message_bytes: int | None = None) -> SocketLimits:
        """The config's limits; `max_message_bytes` for a socket whose messages are smaller
        than max_frame_bytes (the weights server's requests)."""
        largest = cfg.max_frame_bytes if max_message_bytes is None else max_message_bytes
        hwm = cfg.receive_hwm or derived_hwm(cfg.max_frame_bytes)
        return cls(largest, hwm)


def derived_hwm(max_frame_bytes: int) -> int:
    low, high = _HWM_RANGE
    return max(low, min(high, RECEIVE_QUEUE_BYTES // max(max_frame_bytes, 1)))


# For sockets made without a config (tests, tools): the codec's own bound on a message.
DEFAULT_LIMITS = SocketLimits(1 << 30, derived_hwm(1 << 30))


def new_socket(
    ctx: zmq.Context, kind: int, linger_ms: int = 1000, *, limits: SocketLimits = DEFAULT_LIMITS
) -> zmq.Socket:
    """Every socket of the transport is made here, so none is without its limits."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
    sock.setsockopt(zmq.RCVHWM, limits.receive_hwm)
    return sock


HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def is_loopback(addr: str) -> bool:
    return addr.startswith(("tcp://127.", "tcp://localhost:", "tcp://[::1]", "ipc://", "inproc://"))


def check_listening(addrs: Mapping[str, str], curve: bool, allow_insecure: bool) -> None:
    """Refuse to listen beyond loopback without CURVE (PeerError naming each such socket by
    its config key), or with transport.allow_insecure warn once per socket. `addrs`: config
    key -> address, e.g. {"transport.episodes_addr": "tcp://0.0.0.0:5555"}."""
    if curve:
        return
    open_ = {key: addr for key, addr in addrs.items() if addr and not is_loopback(addr)}
    if open_ and not allow_insecure:
        named = ", ".join(f"{key} ({addr})" for key, addr in open_.items())
        raise PeerError(
            f"refusing to listen on {named} without transport.curve_dir: anyone who reaches "
            "the port could send batches in a sampler's name or read the weights; make keys "
            "with `python -m grpo keys DIR`, or set transport.allow_insecure=true"
        )
    for key, addr in open_.items():
        log.warning(
            "%s: listening on %s without CURVE (transport.allow_insecure): anyone who reaches "
            "this port can use it",
            key,
            addr,
        )


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
