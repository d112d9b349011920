"""Child processes that die with the process that started them, even when it is SIGKILLed.

A reward worker or math-verify's checker can be stuck in one C call (a catastrophic regex,
SymPy evaluating ``10^{10^{10^{10}}}``) that never reads its input again, so it would never see
its parent go; docs/reliability.md promises no orphans. The child calls
`grpo.runtime.lifetime.die_with_parent` first thing: on Linux the kernel then SIGKILLs it when
its parent dies (``prctl(PR_SET_PDEATHSIG)``). The kernel sends that signal when the *thread*
that forked the child ends, not the process, so `start` forks every child from one daemon
thread that lives as long as the process: a child started from a short-lived thread (an
evaluation's, a test's) is not killed with that thread. Elsewhere than Linux there is no such
signal: a child then ends only on its own (at the end of its input), which a hung one never
reaches.

Children are started with fork and exec (``subprocess``), as a fresh interpreter: safe in a
process with threads, ZeroMQ sockets and CUDA, which a bare fork is not.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from concurrent.futures import Future
from typing import Any

from grpo.runtime.lifetime import PARENT_ENV

from .base import REPO_ROOT

__all__ = ["start"]

_Launch = tuple[list[str], dict[str, Any], Future]


class _Launcher:
    """The thread every child is forked from (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Launch] = queue.SimpleQueue()
        self._pid = -1  # the process the thread runs in: a forked copy has no thread

    def start(self, args: list[str], kwargs: dict[str, Any]) -> subprocess.Popen:
        with self._lock:
            if self._pid != os.getpid():
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._run, name="child-launcher", daemon=True).start()
                self._pid = os.getpid()
        done: Future = Future()
        self._queue.put((args, kwargs, done))
        return done.result()

    def _run(self) -> None:
        launches = self._queue
        while True:
            args, kwargs, done = launches.get()
            try:
                done.set_result(subprocess.Popen(args, **kwargs))
            except BaseException as exc:  # the caller's error (no such file, no memory...)
                done.set_exception(exc)


_LAUNCHER = _Launcher()


def start(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, forked from the launcher thread, with this
    process's environment, this process named in the child's GRPO_PARENT_PID for its
    `die_with_parent`, and the repository first on its PYTHONPATH (a child runs code of
    `grpo`, wherever it was started from)."""
    env = dict(os.environ)
    env[PARENT_ENV] = str(os.getpid())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return _LAUNCHER.start(args, {**kwargs, "env": env})
