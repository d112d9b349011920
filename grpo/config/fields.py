"""A config field: its default and its one-line help side by side."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def knob(default: Any, help: str) -> Any:
    """A field with its documentation next to its default (lists get a fresh copy per instance)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})
