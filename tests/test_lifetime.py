"""No orphans, with real processes: a child started with GRPO_PARENT_PID dies when its parent is
SIGKILLed, or exits at once if the parent is already gone; a busy port is reported with the pid
that holds it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import BinaryIO

import pytest
import zmq

from grpo.runtime.lifetime import PARENT_ENV, alive, die_with_parent, port_holders
from grpo.wire.channels import PeerError, bind
from tests.conftest import REPO

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2  # <linux/prctl.h>

# A parent that starts a child naming it in GRPO_PARENT_PID (or naming no one), and waits. The
# child prints its pid once die_with_parent() has returned, on the pipe the test reads.
_PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c", "from grpo.runtime.lifetime import die_with_parent; "
         "die_with_parent(); "
         "import os, time; print(os.getpid(), flush=True); time.sleep(600)"],
        env={**os.environ, "GRPO_PARENT_PID": str(os.getpid()) if sys.argv[1] == "set" else ""},
    )
    child.wait()
    """
)


def _readline(pipe: BinaryIO, timeout: float) -> str:
    """The next line written to `pipe` (unbuffered: bufsize=0), "" once every writer has closed
    it; an AssertionError if neither happens within `timeout` seconds."""
    if not select.select([pipe], [], [], timeout)[0]:
        raise AssertionError(f"nothing written in {timeout} s")
    return pipe.readline().decode()


def _wait_until_gone(pid: int, timeout: float) -> None:
    """Return once `pid` has exited, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("named", ["set", "unset"])
def test_a_child_dies_with_its_sigkilled_parent_only_when_named(named):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, named], stdout=subprocess.PIPE,
                              bufsize=0, env=env, start_new_session=True)  # fmt: skip
    try:
        child = int(_readline(parent.stdout, timeout=60))  # die_with_parent() has returned
        assert alive(child)
        parent.kill()  # SIGKILL: no handler runs, only the kernel can act
        parent.wait()
        _wait_until_gone(child, timeout=10 if named == "set" else 1)
        assert alive(child) == (named == "unset")  # a process not started by us is left alone
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


# A parent whose child calls die_with_parent() only once the parent is gone (SIGKILLed by the
# test) and the child has been reparented: as when the launcher dies while its child starts.
_PARENT_GONE_FIRST = textwrap.dedent(
    """
    import os, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]],
                             env={**os.environ, "GRPO_PARENT_PID": str(os.getpid())})
    print(child.pid, flush=True)
    child.wait()
    """
)
_LATE_CHILD = textwrap.dedent(
    """
    import os, time
    from grpo.runtime.lifetime import die_with_parent

    parent, deadline = int(os.environ["GRPO_PARENT_PID"]), time.monotonic() + 60
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)
    print("reparented" if os.getppid() != parent else "still its child", flush=True)
    die_with_parent()
    print("still running", flush=True)
    """
)


def test_a_child_whose_parent_died_before_it_called_die_with_parent_exits_at_once():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT_GONE_FIRST, _LATE_CHILD],
                              stdout=subprocess.PIPE, bufsize=0, env=env,
                              start_new_session=True)  # fmt: skip
    try:
        child = int(_readline(parent.stdout, timeout=60))
        parent.kill()
        parent.wait()
        # The child's lines until it exits (when the pipe's last writer closes it).
        lines = list(iter(lambda: _readline(parent.stdout, timeout=60), ""))
        assert lines == ["reparented\n"]  # and not "still running"
        _wait_until_gone(child, timeout=10)  # exited (a zombie not yet reaped counts as gone)
        assert not alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def _death_signal() -> int:
    """The signal the kernel sends this process when its parent exits (0: none)."""
    libc = ctypes.CDLL(None, use_errno=True)
    sig = ctypes.c_int()  # PR_GET_PDEATHSIG writes it through the pointer
    assert libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) == 0
    return sig.value


def test_die_with_parent_ignores_an_inherited_or_foreign_value(monkeypatch):
    """Called in the test process, which no launcher started: nothing changes, no exit."""
    assert _death_signal() == 0
    try:
        # A running process other than our parent (as inherited from a launcher further up),
        # and values that name no process.
        for value in (str(os.getpid()), "not-a-pid", "", "0"):
            monkeypatch.setenv(PARENT_ENV, value)
            die_with_parent()
            assert _death_signal() == 0, value
    finally:  # a broken die_with_parent must not leave the test process tied to its parent
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)


def test_a_busy_port_is_reported_with_the_pid_holding_it():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert [h.split(" (")[0] for h in port_holders(port)] == [f"pid {os.getpid()}"]
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        with pytest.raises(PeerError, match=f"the port is held by pid {os.getpid()} \\("):
            bind(sock, f"tcp://127.0.0.1:{port}", "episodes")
        sock.close()
    finally:
        holder.close()
    assert port_holders(port) == []


# vLLM's layout: the sampler starts the engine process (none of our code), which starts the
# worker (which imports grpo.rollout.vllm_worker). Here: top -> middle -> leaf. The leaf prints
# the middle's pid and its own once die_with_ancestor() has returned (its watch thread started).
_TOP = textwrap.dedent(
    """
    import os, subprocess, sys, time
    leaf = ("from grpo.runtime.lifetime import die_with_ancestor; die_with_ancestor(); "
            "import os, time; print(os.getppid(), os.getpid(), flush=True); time.sleep(600)")
    middle = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r]); "
              "time.sleep(600)" % leaf)
    subprocess.Popen([sys.executable, "-c", middle],
                     env={**os.environ, "GRPO_PARENT_PID": str(os.getpid())})
    time.sleep(600)
    """
)


def test_the_engine_and_its_worker_die_with_the_sampler():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    top = subprocess.Popen([sys.executable, "-c", _TOP], stdout=subprocess.PIPE, bufsize=0,
                           env=env, start_new_session=True)  # fmt: skip
    try:
        middle, leaf = map(int, _readline(top.stdout, timeout=60).split())
        assert alive(middle) and alive(leaf)
        top.kill()
        top.wait()
        _wait_until_gone(middle, timeout=10)
        _wait_until_gone(leaf, timeout=10)
        assert not alive(middle) and not alive(leaf)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(top.pid, signal.SIGKILL)
