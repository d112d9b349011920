"""No orphans: a process we start dies with the process that started it, whatever signal that
one got (SIGKILL and the OOM killer included, which leave no chance to clean up), and a port
still held by a leftover process is reported with that process's pid.

torchrun starts each trainer rank in a session of its own, so killing the launcher's process
group does not reach the ranks; and a rank left running keeps the trainer's ports, which a
restarted sampler would then connect to. launch.sh (both roles) and grpo.trainer.launch name
themselves in GRPO_PARENT_PID; the process they start calls `die_with_parent()` first thing.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

PARENT_ENV = "GRPO_PARENT_PID"
# launch.sh's healing: how often it restarted this role so far, and how often it still would.
RESTARTS_ENV, RESTARTS_LEFT_ENV = "GRPO_RESTARTS", "GRPO_RESTARTS_LEFT"
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """If GRPO_PARENT_PID names our parent: have the kernel SIGKILL us when it exits (Linux
    prctl PR_SET_PDEATHSIG), and exit now if it is already gone. A process that merely
    inherited the variable (from an ancestor that still runs) is left alone, as is one
    started some other way (a user's shell, nohup, a supervisor)."""
    wanted = _named_pid()
    if wanted is None or not sys.platform.startswith("linux"):
        return
    if os.getppid() != wanted and alive(wanted):
        return  # not started by the launcher that set it (the variable was inherited)
    # Here our parent is the launcher, or the launcher is gone: then it started us and died
    # before we got here, and we were reparented (to init or a subreaper).
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    # The kernel signals only a parent's exit after the signal is set: a parent gone before
    # (before the check above or between the two) has left us reparented.
    if os.getppid() != wanted:
        os._exit(1)


def _count(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def restarts() -> int:
    """Times launch.sh restarted this role so far (0: its first start, or not supervised)."""
    return _count(RESTARTS_ENV)


def restarts_left() -> int:
    """Times launch.sh will still restart this role if it dies (0: not supervised)."""
    return _count(RESTARTS_LEFT_ENV)


def _named_pid() -> int | None:
    """The pid GRPO_PARENT_PID holds; None if it holds none (unset, empty, not a number, or
    0, which no process has: a value that cannot name a parent is left alone, not obeyed)."""
    value = os.environ.get(PARENT_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def die_with_ancestor() -> None:
    """die_with_parent() for a process one level further down: vLLM's worker, whose parent is
    the engine process the sampler started (and which runs none of our code). When the
    process GRPO_PARENT_PID names is gone, a watch thread SIGKILLs the processes between it
    and us, then exits: the engine dies with its sampler and the worker with the engine."""
    wanted = _named_pid()
    if wanted is None or not sys.platform.startswith("linux"):
        return
    if os.getppid() == wanted:
        die_with_parent()
        return
    between = _ancestors_below(wanted)
    if between is None:
        return  # not below it: the variable was inherited by something else

    def watch() -> None:
        while alive(wanted):
            time.sleep(0.5)
        for pid in between:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="grpo-die-with-ancestor").start()


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): state,
    parent pid, ... Raises OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int:
    return int(_stat(pid)[1])


def _ancestors_below(ancestor: int) -> list[int] | None:
    """Our ancestors up to (not including) `ancestor`, nearest first; None if it is not one."""
    chain, pid = [], os.getppid()
    while pid > 1:
        if pid == ancestor:
            return chain
        chain.append(pid)
        try:
            pid = parent_of(pid)
        except OSError:
            return None
    return None


def alive(pid: int) -> bool:
    """Running (a zombie has exited and only waits to be reaped)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def port_holders(port: int) -> list[str]:
    """'pid N (command line)' of each process listening on TCP `port` on this host, found
    through /proc (the socket inode in /proc/net/tcp*, then the fd that points at it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{inode}]")
    holders = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                raw = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                cmd = " ".join(raw.decode(errors="replace").split())  # one line, even for -c
                holders.append(f"pid {proc.name} ({cmd[:160]})")
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return holders


def exit_soon(why: str, grace_s: float = 30.0) -> None:
    """Exit with status 1 in `grace_s` unless the process ends first: for a main thread stuck
    where no stop flag reaches it (a hung generate, a reward call that never returns). Nothing
    is lost that a restart needs: batches are spooled and training states saved before use."""

    def later() -> None:
        time.sleep(grace_s)
        logging.getLogger("grpo").error("exiting: %s (still stuck after %g s)", why, grace_s)
        logging.shutdown()
        os._exit(1)

    threading.Thread(target=later, daemon=True, name="grpo-exit-soon").start()


def exit_now(code: int) -> NoReturn:
    """End a worker whose work is done and whose files, sockets and process groups are closed:
    the atexit handlers run (logging's flush, the libraries' own clean-ups), then the process
    ends without Python's teardown, whose garbage collections walk every object torch,
    transformers and DeepSpeed made (0.5-1 s for each of the three to five processes of a
    run). Only daemon threads can still be running, and a normal exit does not wait for them."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
