"""What a process is doing and whether it gets anywhere: its phase and a counter that moves while
it works.

A heartbeat proves its sender's heartbeat thread runs, not that its main thread does: a hung
`generate`, engine step or reward call beats on. So each role's heartbeats carry its activity
(phase, detail, counter), its own heartbeat thread checks it, and its peer watches it too; a
working phase whose counter has not moved for `transport.stall_timeout_s` is a stall, named by
its phase. Waiting phases (starting, waiting for a peer) are never stalls: a peer's silence has
its own timeouts.

Each process has one `ACTIVITY`, which the code doing the work updates (`enter`, `during`, `tick`):
generation ticks per token step or finished request, scoring and training per micro-batch,
rewards per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

STARTING, WAITING = "starting", "waiting"
IDLE_PHASES = frozenset({STARTING, WAITING})

GENERATING, SCORING, REWARDING = "generating", "scoring", "rewarding"
TRAINING, EVALUATING, PUBLISHING, SAVING = "training", "evaluating", "publishing", "saving"
RECEIVING = "receiving weights"  # a streamed version coming in, bucket by bucket


@dataclass(frozen=True)
class Snapshot:
    """An activity as a heartbeat carries it."""

    phase: str
    detail: str
    count: int

    def describe(self) -> str:
        return f"{self.phase} ({self.detail})" if self.detail else self.phase

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "detail": self.detail, "progress": self.count}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Snapshot | None:
        """The activity in a heartbeat's body, or None if it carries none (or a malformed
        one: a peer's bad field must not crash the reader)."""
        phase, detail, count = body.get("phase"), body.get("detail", ""), body.get("progress")
        if not isinstance(phase, str) or not isinstance(detail, str) or not isinstance(count, int):
            return None
        return cls(phase, detail, count)


class Activity:
    """This process's phase and progress counter; the main thread writes, heartbeats read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = Snapshot(STARTING, "", 0)

    def enter(self, phase: str, detail: str = "") -> None:
        with self._lock:
            self._now = Snapshot(phase, detail, self._now.count)

    def tick(self, n: int = 1) -> None:
        with self._lock:
            now = self._now
            self._now = Snapshot(now.phase, now.detail, now.count + n)

    @contextmanager
    def during(self, phase: str, detail: str = "") -> Iterator[None]:
        """In `phase` for the block, then back to the phase before it."""
        before = self.snapshot()
        self.enter(phase, detail)
        try:
            yield
        finally:
            self.enter(before.phase, before.detail)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._now


ACTIVITY = Activity()


class StallClock:
    """How long an activity, seen through successive snapshots, has been in one working phase
    without its counter moving."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.last: Snapshot | None = None
        self.since = clock()

    def see(self, snap: Snapshot) -> None:
        if snap != self.last:  # a new phase, or the counter moved
            self.since = self.clock()
        self.last = snap

    def stalled(self, limit_s: float) -> str | None:
        """'no progress in PHASE for N s' once the limit is passed in a working phase, else
        None; a limit of 0 never stalls."""
        last = self.last
        if not limit_s or last is None or last.phase in IDLE_PHASES:
            return None
        waited = self.clock() - self.since
        if waited <= limit_s:
            return None
        return f"no progress in {last.describe()} for {waited:.0f} s (limit {limit_s:g} s)"


class Watchdog:
    """This process's own activity, checked from its heartbeat thread: `on_stall` is called
    once, with the reason, when the main thread stalls (see the module docstring)."""

    def __init__(self, limit_s: float, on_stall: Callable[[str], None]):
        self.limit_s = limit_s
        self.on_stall = on_stall
        self.clock = StallClock()
        self.fired = False

    @property
    def exit_grace_s(self) -> float:
        """How long a stalled process gets to end by itself before it is exited: the stall
        limit, at most 30 s (the limit already waited; a short one in tests waits short)."""
        return min(30.0, self.limit_s)

    def check(self) -> None:
        self.clock.see(ACTIVITY.snapshot())
        if not self.fired and (why := self.clock.stalled(self.limit_s)) is not None:
            self.fired = True
            self.on_stall(why)


class Stopwatch(dict):
    """Seconds spent per named part of a step, in the order the parts ran:
    `with seconds("train_s"): ...` adds that block's wall time to `seconds["train_s"]`;
    `with seconds.stage("train_s", TRAINING, "step 3"): ...` also puts this process in that
    phase for the block (ACTIVITY: what its heartbeats report and the stall check watches)."""

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.monotonic() - start

    @contextmanager
    def stage(self, name: str, phase: str, detail: str) -> Iterator[None]:
        with self(name), ACTIVITY.during(phase, detail):
            yield


def terminal_bar(**kwargs: Any) -> Any:
    """A tqdm bar drawn on a terminal only: in a log file its redraws run into the log lines
    (whoever draws one logs each unit as a line when `bar.disable`). TQDM_DISABLE=1 still turns
    it off (launch.sh sets it for a sampler sharing the trainer's terminal); an explicit
    `disable` would override the variable."""
    import os

    from tqdm import tqdm

    return tqdm(**kwargs, **({} if os.environ.get("TQDM_DISABLE") else {"disable": None}))
