"""Scoring many answers at once: the reward function runs in a pool of worker processes, each
call with a time limit, so that one reward that never returns costs one answer's score, not the
run, whatever it is stuck in.

`RewardRunner.score_all` returns one `(reward, info)` per `(completion, row)` call, in call
order, each as `grpo.tasks.score` makes it (an exception scores 0.0 with a ``reward_error``).
A call still running `timeout_s` after it *started* (time waiting for a free worker does not
count) scores 0.0 with ``{"reward_error": "timeout"}`` and is logged; its worker is killed and
a new one takes its place, so the pool keeps its size. A worker that dies during a call (a
crash in C, ``os._exit``) scores that call 0.0 with a ``reward_error`` saying so, and is
replaced too. Rewards are functions of the text and the row, so the results do not depend on
which worker ran which call; with ``workers=1`` the calls run one at a time, in order.

Why processes: Python cannot stop a thread. A reward stuck in C code that holds the GIL (a
catastrophic regex, SymPy computing ``10^{10^{10^{10}}}``) stops every thread of its process,
the one timing it and the heartbeats included; in a worker process it stops only that worker,
which SIGKILL ends. `grpo.tasks.workers` says how workers start (a fresh interpreter, not a
fork) and `grpo.tasks.children` how they die with the sampler. The reward function is sent to
them pickled, that is by reference: it must be importable, a top-level function (or other
picklable callable) of a module, as ``data.reward``'s ``package.module:function`` and every
task's reward are; a lambda, a closure or a function of ``__main__`` is refused when the runner
is made, in one line.

Cost: a call is a round trip over two pipes, about 0.1 ms more than calling the function in
place; workers start once (a fresh interpreter importing `grpo.tasks` and the reward's module,
about 0.1 s, all at once on the first `score_all`) and stay for the runner's life. A
replacement costs one such start.

`counters` (`RunnerCounters`) counts the calls, timeouts, kills, deaths and replacements so
far; `RunnerCounters.stats()` gives them as metrics. More than `max_hangs` timeouts in a row
(no call returning between them) raise `RewardHangError` naming the function: a reward that
hangs on everything makes the run worthless, at `timeout_s` a call.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import wait

from grpo.runtime.progress import ACTIVITY

from .base import RewardFn, Row, _fn_name, logger
from .workers import Worker

__all__ = ["TIMEOUT", "RewardHangError", "RewardRunner", "RewardWorkerError", "RunnerCounters"]

# The reward_error of a call that ran past its time limit (the trainer counts these).
TIMEOUT = "timeout"
# Timeouts in a row (no call returning between them) a runner tolerates.
MAX_HANGS = 32
# Seconds a worker may take to start: an interpreter importing the reward's module (torch...).
STARTUP_TIMEOUT_S = 120.0
# How long close() waits for idle workers to exit before killing them.
CLOSE_WAIT_S = 1.0
# The longest single wait for the workers: a bound on how late a deadline can be noticed.
_MAX_WAIT_S = 3600.0


class RewardHangError(RuntimeError):
    """A reward function timed out on more than `max_hangs` calls in a row."""


class RewardWorkerError(RuntimeError):
    """A worker could not load the reward function, did not start, or the function raised what
    `grpo.tasks.score` lets through (SystemExit, KeyboardInterrupt)."""


@dataclass
class RunnerCounters:
    """What a runner has done so far, for the sampler's metrics (`stats`)."""

    calls: int = 0  # calls scored, timeouts and deaths included
    timeouts: int = 0  # calls past timeout_s: scored 0 with reward_error "timeout"
    kills: int = 0  # workers killed: each timeout's, and those busy when a batch was abandoned
    deaths: int = 0  # workers that died by themselves (their call scored 0, reward_error set)
    replacements: int = 0  # workers started in place of a killed or dead one

    def stats(self) -> dict[str, float]:
        """As batch metrics: ``reward_worker_<counter>``, totals since the runner started."""
        return {f"reward_worker_{k}": float(v) for k, v in asdict(self).items()}


class _Batch:
    """One `score_all` call's results, by call index, and the calls not yet sent."""

    def __init__(self, calls: Sequence[tuple[str, Row]]) -> None:
        self.calls = calls
        self.results: list[tuple[float, dict] | None] = [None] * len(calls)
        self.todo = deque(range(len(calls)))
        self.left = len(calls)

    def put(self, index: int, result: tuple[float, dict]) -> None:
        self.results[index] = result
        self.left -= 1
        ACTIVITY.tick()  # an answer scored: progress for the stall check (grpo.runtime.progress)


class RewardRunner:
    """Scores `(completion, row)` calls with `reward_fn` on `workers` processes, each call within
    `timeout_s` seconds (see the module docstring). The workers start on the first `score_all`;
    `close` (or leaving a ``with`` block) stops them. One `score_all` runs at a time: callers
    from several threads take turns."""

    def __init__(
        self,
        reward_fn: RewardFn,
        workers: int = 4,
        timeout_s: float = 60.0,
        max_hangs: int = MAX_HANGS,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if max_hangs < 0:
            raise ValueError(f"max_hangs must be >= 0, got {max_hangs!r}")
        self.reward_fn = reward_fn
        self.name = _fn_name(reward_fn)
        self._payload = _pickled(reward_fn, self.name)
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.max_hangs = max_hangs
        self._counters = RunnerCounters()
        self._lock = threading.Lock()  # one score_all at a time; guards everything below
        self._pool: list[Worker] = []
        self._started = 0  # workers ever started: their numbers, and the replacements
        self._hangs = 0  # timeouts since a call last returned
        self._closed = False

    @property
    def counters(self) -> RunnerCounters:
        """A copy of the counts so far (see RunnerCounters)."""
        with self._lock:
            return replace(self._counters)

    def stats(self) -> dict[str, float]:
        """The counters as batch metrics (grpo.sampler.episodes.AnswerScorer)."""
        return self.counters.stats()

    def pids(self) -> list[int]:
        """The worker processes running now."""
        with self._lock:
            return [w.proc.pid for w in self._pool]

    def score_all(self, calls: Sequence[tuple[str, Row]]) -> list[tuple[float, dict]]:
        """`(reward, info)` of each `(completion, row)`, in the order of `calls`."""
        if not calls:
            return []
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the runner of reward function {self.name} is closed")
            batch = _Batch(calls)
            try:
                while batch.left:
                    self._step(batch)
            except BaseException:
                self._kill_busy()  # their calls belong to the batch given up
                raise
        return batch.results  # type: ignore[return-value]  # all set: left == 0

    def close(self) -> None:
        """Stop the workers: idle ones are asked to exit, and killed if they have not within
        CLOSE_WAIT_S. A second close does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, []
        for worker in pool:
            worker.stop()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for worker in pool:
            while worker.exit_code() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            worker.kill()

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals (under _lock)

    def _step(self, batch: _Batch) -> None:
        """Start missing workers, send calls to idle ones, wait for a reply or the next
        deadline, and act on what happened."""
        self._fill()
        for worker in self._pool:
            if worker.ready and worker.call is None and batch.todo:
                index = batch.todo.popleft()
                try:
                    worker.send(index, *batch.calls[index])
                except OSError:  # it died idle; its replacement takes the call
                    batch.todo.appendleft(index)
        wait([w.replies for w in self._pool], self._wait_s(time.monotonic()))
        for worker in list(self._pool):
            self._read(worker, batch)
        now = time.monotonic()
        for worker in list(self._pool):
            if worker.call is not None and now >= worker.since + self.timeout_s:
                self._time_out(worker, batch)
            elif not worker.ready and now >= worker.since + STARTUP_TIMEOUT_S:
                raise RewardWorkerError(
                    f"a worker for reward function {self.name} did not start within "
                    f"{STARTUP_TIMEOUT_S:g} s (importing its module?)"
                )

    def _fill(self) -> None:
        """Start workers up to `workers`: at first, and at once in place of one killed or dead,
        so that the next batch finds the pool warm."""
        while len(self._pool) < self.workers:
            self._started += 1
            if self._started > self.workers:
                self._counters.replacements += 1
            self._pool.append(Worker(self._payload, self._started))

    def _wait_s(self, now: float) -> float:
        deadlines = [
            w.since + (self.timeout_s if w.ready else STARTUP_TIMEOUT_S)
            for w in self._pool
            if w.call is not None or not w.ready
        ]
        return min([_MAX_WAIT_S, *(max(0.0, d - now) for d in deadlines)])

    def _read(self, worker: Worker, batch: _Batch) -> None:
        """Every reply the worker has sent; a worker whose pipe is at its end is dead."""
        try:
            while worker.replies.poll():
                self._handle(worker, worker.replies.recv(), batch)
        except (EOFError, OSError):
            self._died(worker, batch)

    def _handle(self, worker: Worker, reply: tuple, batch: _Batch) -> None:
        kind = reply[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "scored":
            worker.call = None
            self._hangs = 0
            self._counters.calls += 1
            batch.put(reply[1], reply[2])
        elif kind == "unloadable":
            raise RewardWorkerError(
                f"reward function {self.name} cannot be loaded in a worker process: {reply[1]} "
                "(it must be importable: a top-level function of a module on sys.path)"
            )
        else:  # "raised"
            raise RewardWorkerError(f"reward function {self.name} raised {reply[2]}")

    def _died(self, worker: Worker, batch: _Batch) -> None:
        worker.kill()  # reaps it
        self._pool.remove(worker)
        code = worker.proc.returncode
        if not worker.ready:
            raise RewardWorkerError(
                f"a worker for reward function {self.name} exited with code {code} before it "
                "was ready (its output is above)"
            )
        self._counters.deaths += 1
        self._fill()
        if worker.call is None:
            logger.warning("a reward worker of %s died idle (exit code %s)", self.name, code)
            return
        error = f"the reward worker died (exit code {code})"
        self._counters.calls += 1
        batch.put(worker.call, (0.0, {"reward_error": error}))
        logger.warning("reward function %s: %s; scored 0, worker replaced", self.name, error)

    def _time_out(self, worker: Worker, batch: _Batch) -> None:
        assert worker.call is not None
        worker.kill()
        self._pool.remove(worker)
        c = self._counters
        c.timeouts, c.kills, c.calls = c.timeouts + 1, c.kills + 1, c.calls + 1
        self._hangs += 1
        batch.put(worker.call, (0.0, {"reward_error": TIMEOUT}))
        self._fill()
        logger.warning(
            "reward function %s did not return within %g s (reward.timeout_s): scored 0 with "
            "reward_error %r; its worker was killed and is replaced (%d timeouts so far)",
            self.name,
            self.timeout_s,
            TIMEOUT,
            c.timeouts,
        )
        if self._hangs > self.max_hangs:
            raise RewardHangError(
                f"reward function {self.name}: {self._hangs} calls in a row timed out after "
                f"{self.timeout_s:g} s (more than {self.max_hangs}); it hangs on these inputs: "
                "fix it, or raise reward.timeout_s if it is only slow"
            )

    def _kill_busy(self) -> None:
        """Kill the workers running a call (of a batch given up); idle and starting ones stay."""
        for worker in [w for w in self._pool if w.call is not None]:
            worker.kill()
            self._pool.remove(worker)
            self._counters.kills += 1


def _pickled(reward_fn: RewardFn, name: str) -> bytes:
    """The reward function as the workers receive it; ValueError in one line if it cannot be."""
    why = ""
    if getattr(reward_fn, "__module__", None) == "__main__":
        why = "it is defined in __main__, which a worker does not import"
    else:
        try:
            return pickle.dumps(reward_fn)
        except Exception as exc:  # PicklingError, AttributeError (a local), TypeError
            why = f"{type(exc).__name__}: {exc}"
    raise ValueError(
        f"reward function {name} cannot be sent to a reward worker process ({why}); define it "
        "at the top level of an importable module (data.reward: 'package.module:function')"
    )
