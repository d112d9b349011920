"""The benchmarks still run (quick sizes) and write their JSON with the agreed keys."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# The rows each benchmark writes; each runs as its own test, so that pytest-xdist spreads them.
ROWS = {"transport": 6, "logprobs": 2, "padding": 3, "weight_sync": 1, "overlap": 1, "e2e": 2,
        "recovery": 1, "vllm": 2 * (importlib.util.find_spec("vllm") is not None)}  # fmt: skip


def test_every_benchmark_is_run_by_the_suite():
    from bench.run_all import BENCHMARKS

    assert list(BENCHMARKS) == list(ROWS)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xdist_group("embedded_model")) if n == "vllm" else n
     for n in ROWS],
)  # fmt: skip
def test_benchmark_runs_quick(tmp_path, name):
    env = {**os.environ, "BENCH_RESULTS": str(tmp_path)}
    command = [sys.executable, "-m", "bench.run_all", "--quick", "--only", name]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == ROWS[name], [f.name for f in files]
    keys = {"name", "unit", "baseline", "ours", "ratio", "target", "met", "machine"}
    for f in files:
        row = json.loads(f.read_text())
        assert keys <= row.keys() and row["baseline"] > 0 and row["ours"] > 0


def test_gpu_benchmark_code_runs_on_cpu(tmp_path):
    """No GPU here: its code path runs with a tiny model on CPU so that it does not rot."""
    env = {**os.environ, "BENCH_RESULTS": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench.gpu", "--cpu-smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "gpu_smoke_trainer_mfu.json").read_text())
    assert 0 < row["ratio"] < 1  # a model FLOPs utilisation
    assert "padded sdpa" in row["notes"] and "packed sdpa" in row["notes"]
    gen = json.loads((tmp_path / "gpu_smoke_hf_generate_static_vs_dynamic_cache.json").read_text())
    assert gen["baseline"] > 0 and gen["ours"] > 0  # tokens/s of both KV caches


def test_free_ports_come_from_this_workers_share_outside_the_kernels_range(monkeypatch):
    import socket

    import bench.common

    # a share no worker of this run has (the suite runs 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "8")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw5")
    share = bench.common._unassigned_ports()
    monkeypatch.setattr(bench.common, "_next_port", 0)
    with socket.create_server(("127.0.0.1", share[0])):  # taken: skipped
        ports = [bench.common.free_port() for _ in range(3)]
    assert ports == [share[1], share[2], share[3]]
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert share[-1] < int(ephemeral[0]) and share[0] == 10000 + 5 * len(share)
