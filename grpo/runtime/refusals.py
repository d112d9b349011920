"""How often a process says it refused something a peer sent: the first ten times, then at
every power of two, each line with the count so far. A peer sending garbage costs a few dozen
lines, not one a message (an attacked 4-step run once wrote 4,470): the counts still reach the
metrics row in full."""

from __future__ import annotations

import logging
from typing import Any


def worth_logging(count: int) -> bool:
    """Whether the `count`-th refusal of a kind gets its line."""
    return count <= 10 or count & (count - 1) == 0


def note(log: logging.Logger, count: int, message: str, *args: Any, level: int = logging.WARNING):
    """`message` % `args` at `level`, if the `count`-th refusal of its kind is worth a line."""
    if worth_logging(count):
        log.log(level, message, *args)
