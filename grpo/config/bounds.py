"""Bounds on the config's waits: none negative, none beyond what ZeroMQ can take, none so
short that the loop waiting on it spins. (That every float is finite is checked where values
are typed, grpo.config.loading.)"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from grpo.config.errors import ConfigError

if TYPE_CHECKING:
    from grpo.config.sections import Config


# Both roles' heartbeat threads wake every transport.heartbeat_s (their socket polls and queue
# waits take it as the timeout, in whole milliseconds): a heartbeat of 0, or a hair above it,
# makes them spin and floods the peer with heartbeats.
MIN_HEARTBEAT_S = 0.01
# ZeroMQ takes its waits (SNDTIMEO, poll) as a C int of milliseconds: 24.8 days at most; a
# longer one overflows where the socket is set up, mid-run.
MAX_WAIT_S = (2**31 - 1) // 1000


def durations(node: Any, prefix: str = "") -> list[tuple[str, float, float]]:
    """Every wait of the config tree, found by its name: (key, value, seconds) of each key
    ending in _s (seconds) or _ms (milliseconds), so a new timeout is bounded unlisted."""
    found = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            found += durations(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and f.name.endswith(("_s", "_ms")):
            seconds = value / 1000 if f.name.endswith("_ms") else value
            found.append((f"{prefix}{f.name}", value, seconds))
    return found


def check_waits(cfg: Config) -> None:
    """Bounds on every wait (finite it is already: grpo.config.loading): none negative, none
    beyond ZeroMQ's, and none so short that the loop waiting on it spins."""
    for key, value, seconds in durations(cfg):
        if seconds < 0:
            raise ConfigError(f"{key} must be >= 0, got {value!r}")
        if seconds > MAX_WAIT_S:
            raise ConfigError(
                f"{key} must be at most {MAX_WAIT_S} s (ZeroMQ takes waits as 32-bit "
                f"milliseconds), got {value!r}"
            )
    if cfg.transport.heartbeat_s < MIN_HEARTBEAT_S:
        raise ConfigError(
            f"transport.heartbeat_s must be >= {MIN_HEARTBEAT_S} s, got "
            f"{cfg.transport.heartbeat_s!r}: shorter, both roles' heartbeat threads spin"
        )
    reload_s = cfg.rollout.vllm.reload_timeout_s
    if reload_s <= 0:
        raise ConfigError(
            f"rollout.vllm.reload_timeout_s must be > 0, got {reload_s!r}: every in-place "
            "load would count as failed and restart the engine"
        )
