"""The transport section of the config tree: the ZeroMQ addresses, limits and timeouts both
roles share, with the checks of its own values."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.errors import ConfigError
from grpo.config.fields import knob, require_signs
from grpo.core.names import SAMPLER_ID_RULE, is_sampler_id

# A message part ZeroMQ is told to take at most (ZMQ_MAXMSGSIZE is an int64; past memory,
# any limit is none).
MAX_FRAME_BYTES = 1 << 40


@dataclass
class TransportConfig:
    episodes_addr: str = knob(
        "tcp://127.0.0.1:5555", "trainer binds, samplers connect: episode batches"
    )
    control_addr: str = knob(
        "tcp://127.0.0.1:5556", "trainer binds, samplers connect: heartbeats, done, stop"
    )
    weights_addr: str = knob(
        "",
        "trainer binds, samplers fetch each new version over ZeroMQ (chunked, checksummed) into "
        "their own output_dir: no shared filesystem needed; '' = samplers read the trainer's",
    )
    heartbeat_s: float = knob(2.0, "seconds between heartbeats")
    peer_timeout_s: float = knob(120.0, "a silent peer for this long is taken for dead")
    stall_timeout_s: float = knob(
        600.0,
        "a working phase (generating, scoring, rewarding, training, evaluating, ...) whose "
        "progress counter has not moved for this long is a stall: the process stops, naming "
        "the phase, and the trainer drops a stalled sampler; 0 = never",
    )
    startup_timeout_s: float = knob(900.0, "how long to wait for the peer's first message")
    max_frame_bytes: int = knob(
        1 << 30,
        "larger messages are dropped; ZeroMQ refuses a larger message part before buffering it "
        "(ZMQ_MAXMSGSIZE on every socket)",
    )
    receive_hwm: int = knob(
        0,
        "messages a receiving socket queues per connection before it stops reading from that "
        "peer (whose sends then wait): with max_frame_bytes, what one peer can make this "
        "process hold; 0 = 256 MiB / max_frame_bytes, between 2 and 1000 (2 at the default)",
    )
    max_version_bytes: int = knob(
        1 << 40,
        "a streamed weights version (transport.weights_addr) whose manifest lists more bytes, "
        "in one file or in all, is refused before anything is written",
    )
    curve_dir: str = knob(
        "",
        "CURVE keys (python -m grpo keys DIR): authenticate and encrypt every connection, "
        "refuse peers without an authorised key; '' = off (fine on loopback, not across nodes)",
    )
    relay_samplers: list[str] = knob(
        [],
        "without curve_dir, the sampler ids (rollout.sampler_id) whose relays (weights.mode "
        "stream) the trainer tells other samplers of: one batch anyone sends under a made-up "
        "id vouches for it, so without CURVE no relay is taken unless listed here; under "
        "CURVE every authorised sampler may relay",
    )
    allow_insecure: bool = knob(
        False,
        "bind a transport address beyond loopback without curve_dir (each such socket is "
        "named in a warning); false = refuse to start: anyone who reaches the port could send "
        "batches in a sampler's name or read the weights",
    )


def check_transport(t: TransportConfig) -> None:
    require_signs("transport", t, ("peer_timeout_s", "startup_timeout_s"))
    if t.heartbeat_s * 2 > t.peer_timeout_s:
        raise ConfigError(
            f"transport.peer_timeout_s ({t.peer_timeout_s}) must be at least twice "
            f"transport.heartbeat_s ({t.heartbeat_s}), or live peers look dead"
        )
    if t.stall_timeout_s and t.stall_timeout_s < 2 * t.heartbeat_s:
        raise ConfigError(
            f"transport.stall_timeout_s ({t.stall_timeout_s}) must be 0 (never) or at least "
            f"twice transport.heartbeat_s ({t.heartbeat_s}): heartbeats carry the progress"
        )
    if bad := [sid for sid in t.relay_samplers if not is_sampler_id(sid)]:
        raise ConfigError(
            f"transport.relay_samplers: {bad[0]!r} is no sampler id ({SAMPLER_ID_RULE})"
        )
    addrs = [a for a in (t.episodes_addr, t.control_addr, t.weights_addr) if a]
    if len(set(addrs)) < len(addrs):
        raise ConfigError("transport.episodes_addr, control_addr and weights_addr must differ")
    if not 1 << 20 <= t.max_frame_bytes <= MAX_FRAME_BYTES:
        raise ConfigError(
            f"transport.max_frame_bytes must be in [1 MiB, 1 TiB], got {t.max_frame_bytes}"
        )
    if t.receive_hwm < 0:
        raise ConfigError(f"transport.receive_hwm must be >= 0 (0 = derived), got {t.receive_hwm}")
    if t.max_version_bytes < 1:
        raise ConfigError(f"transport.max_version_bytes must be >= 1, got {t.max_version_bytes}")
