"""One reward worker: a child process that scores one answer at a time with the run's reward
function, for `grpo.tasks.runner`, which starts, feeds, times and kills these.

The child is a fresh interpreter (``python -c``, forked and exec'd from the launcher thread of
`grpo.tasks.children`) that dies with its parent. Not ``fork`` alone: the sampler has threads,
ZeroMQ sockets and CUDA, and a forked copy of it can deadlock on a lock another thread held.
Not `multiprocessing`'s spawn or forkserver either: both import the parent's main script again
in every worker (the sampler's imports torch and the whole sampler: seconds and gigabytes per
worker) unless it is run with ``-m``. A worker imports only `grpo.tasks` and the reward's own
module, once, when it starts; the pool keeps it for the whole run.

The protocol, over two pipes (`multiprocessing.connection` framing: pickles):
    parent -> worker: (sys.path, pickled reward function), then (index, completion, row) per
                      call, or None to stop
    worker -> parent: ("ready",) or ("unloadable", why); then per call ("scored", index,
                      (reward, info)) or ("raised", index, why) for what `score` lets through
                      (SystemExit...), after which the worker exits
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from grpo.runtime.lifetime import die_with_parent

from . import children
from .base import RewardFn, Row, score

__all__ = ["Worker", "main"]

_COMMAND = "from grpo.tasks.workers import main; main()"


class Worker:
    """The parent's handle on one worker process: its pipes, and the call it is running."""

    def __init__(self, payload: bytes, number: int) -> None:
        self.number = number
        self.ready = False
        self.call: int | None = None  # the index of the call it runs, None when idle
        self.since = time.monotonic()  # when it started, or started its call
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        try:
            self.proc = children.start(
                [sys.executable, "-c", _COMMAND, str(requests_r), str(replies_w), str(number)],
                pass_fds=(requests_r, replies_w),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for fd in (requests_r, requests_w, replies_r, replies_w):
                os.close(fd)
            raise
        os.close(requests_r)  # the child's ends: its death is then EOF on replies
        os.close(replies_w)
        self.requests = Connection(requests_w, readable=False)
        self.replies = Connection(replies_r, writable=False)
        self.requests.send((list(sys.path), payload))

    def send(self, index: int, completion: str, row: Row) -> None:
        self.requests.send((index, completion, row))
        self.call, self.since = index, time.monotonic()

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL and reap: a call stuck in C holding the GIL cannot be stopped any other way."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close_pipes()

    def stop(self) -> None:
        """Ask an idle worker to exit (then `kill` reaps it)."""
        with contextlib.suppress(OSError):  # already dead
            self.requests.send(None)

    def close_pipes(self) -> None:
        for conn in (self.requests, self.replies):
            if not conn.closed:
                conn.close()


def _load(requests: Connection) -> RewardFn:
    path, payload = requests.recv()
    sys.path[:] = list(path) + [p for p in sys.path if p not in path]  # the parent's imports
    fn = pickle.loads(payload)
    if not callable(fn):
        raise TypeError(f"a {type(fn).__name__} is not callable")
    return fn


def main() -> None:
    """The worker process (see the module docstring for the protocol)."""
    die_with_parent()  # a worker stuck in C never reads its pipe again, so never sees EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    requests_fd, replies_fd, number = (int(a) for a in sys.argv[1:4])
    logging.basicConfig(format=f"reward worker {number}: %(levelname)s %(message)s")
    requests = Connection(requests_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    try:
        fn = _load(requests)
    except BaseException as exc:  # an import error in the reward's module, most likely
        replies.send(("unloadable", f"{type(exc).__name__}: {exc}"))
        return
    replies.send(("ready",))
    while True:
        try:
            request: Any = requests.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        index, completion, row = request
        try:
            result = score(fn, completion, row)
        except BaseException as exc:  # what score lets through: the caller's to raise
            replies.send(("raised", index, f"{type(exc).__name__}: {exc}"))
            return
        replies.send(("scored", index, result))
