"""The checks of how versions travel (weights.*), and the mode a config resolves to."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from grpo.config.engines import abilities
from grpo.config.errors import ConfigError

if TYPE_CHECKING:
    from grpo.config.sections import Config


def check_weights(cfg: Config) -> None:
    w, mode = cfg.weights, weights_mode(cfg)
    if mode in ("files", "stream", "collective") and not cfg.transport.weights_addr:
        raise ConfigError(
            f"weights.mode: {mode} needs transport.weights_addr (where the trainer serves them)"
        )
    if mode == "shared_dir" and cfg.transport.weights_addr:
        raise ConfigError(
            "weights.mode: shared_dir reads the trainer's dirs: drop "
            "transport.weights_addr, or choose files or stream"
        )
    if w.bucket_mb <= 0 or w.keep_bases < 1 or w.window < 1 or w.transfer_timeout_s <= 0:
        raise ConfigError(
            "weights.bucket_mb, keep_bases, window and transfer_timeout_s must be positive"
        )
    backend = cfg.rollout.backend
    in_memory = abilities(backend).adapters_in_memory
    if streams_versions(cfg) and cfg.model.lora.enabled and not in_memory:
        raise ConfigError(
            f"weights.mode: {mode} cannot hand the {backend} engine a LoRA "
            "adapter (it loads adapters from a dir): use weights.mode files or "
            "shared_dir"
        )
    if mode == "collective":
        _check_collective(cfg)
    if w.fanout < 0 or w.save_interval < 0:
        raise ConfigError("weights.fanout and weights.save_interval must be >= 0")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def host_port(addr: str) -> tuple[str, int]:
    """weights.collective_addr (tcp://host:port) as (host, port); ValueError else."""
    parts = urlsplit(addr)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"weights.collective_addr must be tcp://host:port, got {addr!r}")
    return parts.hostname, parts.port


def _check_collective(cfg: Config) -> None:
    w, t = cfg.weights, cfg.transport
    try:
        host_port(w.collective_addr)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if w.collective_timeout_s <= 0:
        raise ConfigError("weights.collective_timeout_s must be positive")
    taken = {t.episodes_addr, t.control_addr, t.weights_addr, w.relay_addr}
    if w.collective_addr in taken:
        raise ConfigError(
            f"weights.collective_addr {w.collective_addr} is another transport "
            "address: give the group's meeting point a port of its own"
        )
    if host_port(w.collective_addr)[0] not in LOOPBACK_HOSTS and not t.allow_insecure:
        raise ConfigError(
            f"weights.collective_addr {w.collective_addr} is beyond loopback, and "
            "the group's traffic (gloo) is not encrypted, CURVE or not: set "
            "transport.allow_insecure: true on a network you trust, or use "
            "weights.mode stream"
        )


def weights_mode(cfg: Config) -> str:
    """weights.mode with auto resolved."""
    if cfg.weights.mode != "auto":
        return cfg.weights.mode
    return "files" if cfg.transport.weights_addr else "shared_dir"


def streams_versions(cfg: Config) -> bool:
    """Whether the trainer serves versions from memory (weights.mode stream, and collective,
    whose samplers stream what the group cannot bring them)."""
    return weights_mode(cfg) in ("stream", "collective")
