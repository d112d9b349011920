"""Scoring many answers at once: a reward function called on a pool of threads, each call with
a time limit, so that one reward that never returns costs one answer's score, not the run.

`RewardRunner.score_all` returns one `(reward, info)` per `(completion, row)` call, in call
order, each as `grpo.tasks.score` makes it (an exception scores 0.0 with a ``reward_error``).
A call still running `timeout_s` after it *started* (time waiting for a free worker does not
count) scores 0.0 with ``{"reward_error": "timeout"}`` and is logged once. Rewards are
functions of the text and the row, so the results do not depend on how the threads interleave;
with ``workers=1`` the calls run one at a time, in order, as a plain loop over `score` would.

Why the hung call is abandoned rather than stopped: Python cannot stop a thread. A reward stuck
in a pure-Python loop keeps its thread, and burns a core, until the process ends; one stuck in
C code that holds the GIL (a catastrophic regex, SymPy computing ``10^{10^{10^{10}}}``) stops
every thread of the process, the one timing it included, so no thread-based limit can catch it.
A task that needs a hard kill runs its check in a child process that it can kill, as MATH does
(`grpo.tasks.math500`). Here the stuck worker is left to its call: its result, if it ever comes,
is dropped, and a new worker takes its place so the pool keeps its concurrency. More than
`max_stuck` such threads at once raises `RewardHangError` naming the reward function: a reward
that hangs that often makes the run worthless, and the threads would pile up unbounded.

Why not `concurrent.futures.ThreadPoolExecutor`: its workers are joined when the interpreter
exits, so one hung reward would hang the process's exit too. These workers are daemon threads,
and `close` does not wait for a stuck one.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from grpo.runtime.progress import ACTIVITY

from .base import RewardFn, Row, _fn_name, logger, score

__all__ = ["TIMEOUT", "RewardHangError", "RewardRunner"]

# The reward_error of a call that ran past its time limit (the trainer counts these).
TIMEOUT = "timeout"
# Abandoned threads still stuck in their call that a runner tolerates at once.
MAX_STUCK = 32
# How long close() waits for idle workers to take their stop signal; stuck ones are not waited.
CLOSE_WAIT_S = 1.0
# The longest single wait on the condition: Condition.wait overflows on huge timeouts.
_MAX_WAIT_S = 3600.0


class RewardHangError(RuntimeError):
    """Too many calls of a reward function are stuck past their time limit at once."""


class _Batch:
    """The results of one `score_all` call, by call index."""

    def __init__(self, n: int) -> None:
        self.results: list[tuple[float, dict] | None] = [None] * n
        self.left = n
        self.error: BaseException | None = None  # what `score` let through (SystemExit...)

    def put(self, index: int, result: tuple[float, dict]) -> None:
        self.results[index] = result
        self.left -= 1
        ACTIVITY.tick()  # an answer scored: progress for the stall check (grpo.runtime.progress)


@dataclass(frozen=True)
class _Call:
    batch: _Batch
    index: int
    completion: str
    row: Row


class _Worker:
    """One pool thread and the call it is running (None when idle)."""

    def __init__(self) -> None:
        self.call: _Call | None = None
        self.started = 0.0  # time.monotonic() when `call` started
        self.abandoned = False  # timed out: its call's result is dropped, and it then exits
        self.thread: threading.Thread | None = None


class RewardRunner:
    """Scores `(completion, row)` calls with `reward_fn` on `workers` threads, each call within
    `timeout_s` seconds (see the module docstring). The threads start on the first
    `score_all`; `close` (or leaving a ``with`` block) stops them without waiting for stuck ones.

    With ``workers > 1`` the reward function is called from several threads at once, so it must
    be thread-safe; every call runs outside the main thread, even with ``workers=1``.
    """

    def __init__(
        self,
        reward_fn: RewardFn,
        workers: int = 4,
        timeout_s: float = 60.0,
        max_stuck: int = MAX_STUCK,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if max_stuck < 0:
            raise ValueError(f"max_stuck must be >= 0, got {max_stuck!r}")
        self.reward_fn = reward_fn
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.max_stuck = max_stuck
        self.name = _fn_name(reward_fn)
        self.timeouts = 0  # calls timed out so far
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._cond = threading.Condition()  # guards everything below and every _Worker/_Batch
        self._pool: list[_Worker] = []  # live workers, not abandoned
        self._stuck: list[_Worker] = []  # abandoned workers whose call has not returned
        self._started = 0  # workers ever started, to name their threads
        self._closed = False

    @property
    def stuck(self) -> int:
        """Abandoned threads still inside a timed-out call."""
        with self._cond:
            return len(self._stuck)

    def score_all(self, calls: Sequence[tuple[str, Row]]) -> list[tuple[float, dict]]:
        """`(reward, info)` of each `(completion, row)`, in the order of `calls`."""
        if not calls:
            return []
        batch = _Batch(len(calls))
        with self._cond:
            self._check_open()
            self._fill_pool()
        for index, (completion, row) in enumerate(calls):
            self._calls.put(_Call(batch, index, completion, row))
        with self._cond:
            while True:
                self._check_open()
                wait = self._expire(time.monotonic())  # may complete the batch
                if not batch.left or batch.error is not None:
                    break
                self._fill_pool()  # a new worker for each abandoned one: same concurrency
                self._cond.wait(wait)
        if batch.error is not None:
            raise batch.error
        return batch.results  # type: ignore[return-value]  # all set: left == 0

    def close(self) -> None:
        """Stop the idle workers, waiting at most CLOSE_WAIT_S; stuck ones are left behind
        (daemon threads: they do not keep the process alive). Calls not started are dropped."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            pool, stuck = list(self._pool), len(self._stuck)
            self._cond.notify_all()
        while True:  # calls never started (a caller interrupted mid-batch): nobody waits for them
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in pool:
            self._calls.put(None)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for worker in pool:
            assert worker.thread is not None
            worker.thread.join(max(0.0, deadline - time.monotonic()))
        if stuck:
            logger.warning(
                "reward function %s: %d call(s) past their timeout are still running; their "
                "threads are left to end with the process",
                self.name,
                stuck,
            )

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals (under _cond)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the runner of reward function {self.name} is closed")

    def _fill_pool(self) -> None:
        while len(self._pool) < self.workers:
            worker = _Worker()
            self._started += 1
            worker.thread = threading.Thread(
                target=self._work, args=(worker,), name=f"reward-{self._started}", daemon=True
            )
            worker.thread.start()
            self._pool.append(worker)

    def _expire(self, now: float) -> float:
        """Time out every call that started `timeout_s` ago or more; the seconds until the
        next running call's deadline (at most `timeout_s`: a call may start meanwhile)."""
        wait = self.timeout_s
        for worker in list(self._pool):
            if worker.call is None:
                continue
            left = worker.started + self.timeout_s - now
            if left > 0:
                wait = min(wait, left)
            else:
                self._abandon(worker)
        return min(wait, _MAX_WAIT_S)

    def _abandon(self, worker: _Worker) -> None:
        call = worker.call
        assert call is not None
        worker.abandoned = True
        self._pool.remove(worker)
        self._stuck.append(worker)
        self.timeouts += 1
        call.batch.put(call.index, (0.0, {"reward_error": TIMEOUT}))
        self._cond.notify_all()  # another caller's batch may be the one completed
        logger.warning(
            "reward function %s did not return within %g s (reward.timeout_s): scored 0 with "
            "reward_error %r; its thread is abandoned (%d stuck now, %d timeouts so far)",
            self.name,
            self.timeout_s,
            TIMEOUT,
            len(self._stuck),
            self.timeouts,
        )
        if len(self._stuck) > self.max_stuck:
            raise RewardHangError(
                f"reward function {self.name}: {len(self._stuck)} calls are stuck past their "
                f"{self.timeout_s:g} s timeout at once (more than {self.max_stuck}); it hangs "
                "on these inputs: fix it, or run its slow part in a child process with a "
                "timeout as grpo.tasks.math500 does"
            )

    # ---------------------------------------------------------------- the worker thread

    def _work(self, worker: _Worker) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            with self._cond:
                worker.call, worker.started = call, time.monotonic()
                self._cond.notify_all()  # the caller now has a deadline to watch
            error: BaseException | None = None
            result = (0.0, {})
            try:
                result = score(self.reward_fn, call.completion, call.row)
            except BaseException as exc:  # what score lets through (SystemExit): the caller's
                error = exc
            with self._cond:
                worker.call = None
                if worker.abandoned:  # timed out already; the pool has a replacement
                    self._stuck.remove(worker)
                    return
                if error is not None:
                    call.batch.error = error
                else:
                    call.batch.put(call.index, result)
                self._cond.notify_all()
