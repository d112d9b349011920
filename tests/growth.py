"""How the work of a text function grows with its input: linear, or worse.

`line_events` counts the Python lines a call executes (sys.settrace): exact, and independent
of the machine's load, for code written in Python. Regular expressions run in C, where no line
is traced; `time_growth` compares their times on two input sizes instead, each the least of a
few repeats (a busy machine only ever makes a run slower), with a wide margin: work growing
linearly grows ~8x for 8x the input, quadratic ~64x, cubic ~512x.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

FACTOR = 8  # the large input is this many times the small one
LINEAR_BOUND = 20.0  # growth below this for FACTOR: linear with room for noise; 64 is quadratic


def line_events(fn: Callable[..., Any], *args: Any) -> int:
    """The Python lines `fn(*args)` executes, in every function it calls."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return count


def _least_time(fn: Callable[[str], Any], text: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(text)
        best = min(best, time.perf_counter() - t0)
    return best


def time_growth(fn: Callable[[str], Any], make: Callable[[int], str], small: int) -> float:
    """time(fn(make(FACTOR * small))) / time(fn(make(small))). The small input is repeated
    until it takes a few milliseconds, so the clock's resolution does not dominate."""
    repeats = 1
    while _least_time(fn, make(small), repeats) < 0.005 and repeats < 1 << 16:
        repeats *= 4
    return _least_time(fn, make(FACTOR * small), repeats) / _least_time(fn, make(small), repeats)
