"""A trainer rank whose peer stalls or vanishes says so in our words, not gloo's."""

import os
import subprocess
import sys
import textwrap

import pytest

from grpo.trainer.ranks import collective_failure
from tests.conftest import REPO, free_port

# Two real gloo ranks: rank 0 stalls past the timeout while rank 1 waits in a broadcast.
_STALLED_RANK = textwrap.dedent(
    """
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from grpo.trainer.ranks import collective_failure

    dist.init_process_group("gloo", timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    if rank == 0:
        time.sleep(8)
    try:
        dist.broadcast(torch.zeros(1), 0)
    except RuntimeError as e:
        print("FAILURE:", collective_failure(e, rank, 2), flush=True)
    """
)


@pytest.mark.slow
def test_a_stalled_rank_is_reported_with_the_timeout_and_the_key(tmp_path):
    script = tmp_path / "stalled.py"
    script.write_text(_STALLED_RANK)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # A port of its own: torchrun's default (29500) may be held by another test's ranks.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           f"--master_port={free_port()}", str(script)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("FAILURE: rank 1")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    line = lines[0]
    assert line.startswith("FAILURE: rank 1 gave up waiting for the other trainer ranks (Timed")
    assert "transport.startup_timeout_s + peer_timeout_s = 2 s" in line


def test_other_errors_are_left_alone():
    assert collective_failure(RuntimeError("CUDA out of memory"), 0, 60) is None
    assert collective_failure(ValueError("Timed out waiting"), 0, 60) is None


def test_a_vanished_rank_is_not_blamed_on_the_timeout():
    # What gloo said here when rank 0 broadcast to a rank that had exited.
    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer "
        "[127.0.0.1]:23747. This is typically caused by a remote worker crashing."
    )
    assert collective_failure(gloo, 0, 60) == (
        "rank 0 gave up waiting for the other trainer ranks (Connection closed by peer "
        "[127.0.0.1]:23747); another rank went away: its log says why"
    )
