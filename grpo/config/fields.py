"""A config field: its default and its one-line help side by side."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from grpo.config.errors import ConfigError


def knob(default: Any, help: str) -> Any:
    """A field with its documentation next to its default (lists get a fresh copy per instance)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


def require_signs(
    section_name: str, values: Any, positive: tuple[str, ...], non_negative: tuple[str, ...] = ()
) -> None:
    """ConfigError naming the first key of `section_name` (`values`: the section) that is not
    > 0 among `positive`, or below 0 among `non_negative`."""
    for names, bad, what in (
        (positive, lambda v: v <= 0, "> 0"),
        (non_negative, lambda v: v < 0, ">= 0"),
    ):
        for name in names:
            value = getattr(values, name)
            if bad(value):
                raise ConfigError(f"{section_name}.{name} must be {what}, got {value!r}")


def require_gpu_list(key: str, gpus: list[int]) -> None:
    """ConfigError unless `gpus` (the list at `key`) holds distinct GPU indices >= 0."""
    if any(g < 0 for g in gpus) or len(set(gpus)) < len(gpus):
        raise ConfigError(f"{key} must list distinct GPU indices >= 0, got {gpus}")
