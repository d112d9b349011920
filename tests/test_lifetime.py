"""No orphans, with real processes: a child started with GRPO_PARENT_PID dies when its parent is
SIGKILLed; a busy port is reported with the pid that holds it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import zmq

from grpo.lifetime import PARENT_ENV, alive, die_with_parent, port_holders
from grpo.wire.channels import PeerError, bind
from tests.conftest import REPO

# A parent that starts a child naming it in GRPO_PARENT_PID, prints the child's pid, and waits.
_PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    child = subprocess.Popen(
        [sys.executable, "-c", "from grpo.lifetime import die_with_parent; die_with_parent(); "
         "import time; time.sleep(600)"],
        env={**os.environ, "GRPO_PARENT_PID": str(os.getpid()) if sys.argv[1] == "set" else ""},
    )
    print(child.pid, flush=True)
    child.wait()
    """
)


@pytest.mark.parametrize("named", ["set", "unset"])
def test_a_child_dies_with_its_sigkilled_parent_only_when_named(named):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, named], stdout=subprocess.PIPE,
                              text=True, env=env, start_new_session=True)  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # the child has called die_with_parent()
        assert alive(child)
        parent.kill()  # SIGKILL: no handler runs, only the kernel can act
        parent.wait()
        deadline = time.monotonic() + (10 if named == "set" else 1)
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(child) == (named == "unset")  # a process not started by us is left alone
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)


def test_die_with_parent_ignores_an_inherited_or_foreign_value(monkeypatch):
    monkeypatch.setenv(PARENT_ENV, str(os.getpid()))  # not our parent: nothing happens
    die_with_parent()
    monkeypatch.setenv(PARENT_ENV, "not-a-pid")
    die_with_parent()


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
# worker (which imports grpo.rollout.vllm_worker). Here: top -> middle -> leaf.
_TOP = textwrap.dedent(
    """
    import os, subprocess, sys, time
    leaf = ("from grpo.lifetime import die_with_ancestor; die_with_ancestor(); "
            "import time; time.sleep(600)")
    middle = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', %r]); "
              "print(p.pid, flush=True); time.sleep(600)" % leaf)
    m = subprocess.Popen([sys.executable, "-c", middle], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "GRPO_PARENT_PID": str(os.getpid())})
    print(m.pid, m.stdout.readline().strip(), flush=True)
    time.sleep(600)
    """
)


def test_the_engine_and_its_worker_die_with_the_sampler():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    top = subprocess.Popen([sys.executable, "-c", _TOP], stdout=subprocess.PIPE, text=True,
                           env=env, start_new_session=True)  # fmt: skip
    try:
        middle, leaf = map(int, top.stdout.readline().split())
        time.sleep(1.0)  # the leaf's watch thread is running
        assert alive(middle) and alive(leaf)
        top.kill()
        top.wait()
        deadline = time.monotonic() + 10
        while (alive(middle) or alive(leaf)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(middle) and not alive(leaf)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(top.pid, signal.SIGKILL)
