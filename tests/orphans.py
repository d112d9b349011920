"""Watching processes from outside, through /proc (Linux): whether one still runs, how much CPU
it has used, and killing one a test left behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the fields after "pid (name)"


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a dead one its new parent has not reaped)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_if_running(pid: int) -> None:
    if running(pid):
        os.kill(pid, signal.SIGKILL)
