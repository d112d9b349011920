"""The benchmarks still run (quick sizes), and every row, from a quick run or committed in
bench/results/, is consistent: its ratio is the medians' baseline / ours or ours / baseline as
it declares, and `met` is the worst case over its repetitions (its spread) against its target,
with at least 3 repetitions. The committed rows are full-size runs with a stated scenario, and
the table in docs/benchmarks.md is the one generated from them."""

import difflib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.conftest import REPO

# The rows each benchmark writes; each runs as its own test, so that pytest-xdist spreads them.
ROWS = {"transport": 4, "logprobs": 2, "padding": 3, "weight_sync": 1, "weight_stream": 4,
        "weight_delta": 1, "weight_fanout": 1, "overlap": 1, "e2e": 1, "e2e_vs_trl": 4,
        "continuous": 2, "recovery": 1,
        "hostile": 2, "vllm": 2}  # fmt: skip
HAS_VLLM = importlib.util.find_spec("vllm") is not None  # without it the vllm benchmark writes none
COMMITTED = sorted((REPO / "bench" / "results").glob("*.json"))
KEYS = {"name", "unit", "baseline", "ours", "direction", "ratio", "target", "met", "machine",
        "notes", "quick", "date", "scenario", "repeats", "baseline_spread",
        "ours_spread"}  # fmt: skip


def expected_ratio_and_met(row: dict) -> tuple[float, bool]:
    """The row's ratio (of the medians) and met (the worst case of the spread against the
    target, and 3 repetitions or more) recomputed from its numbers, apart from bench.common."""
    baseline, ours, target = row["baseline"], row["ours"], row["target"]
    (b_low, b_high), (o_low, o_high) = row["baseline_spread"], row["ours_spread"]
    enough = row["repeats"] >= 3
    if row["direction"] == "baseline/ours":  # ours is a cost: seconds, megabytes
        return baseline / ours, enough and b_low / o_high >= target
    if row["direction"] == "ours/baseline":  # ours is a rate, or a share of the baseline
        return ours / baseline, enough and o_low / b_high >= target
    if row["direction"] == "ours<=target":  # ours has a ceiling; the ratio is for comparison
        return baseline / ours, enough and o_high <= target
    raise AssertionError(f"{row['name']}: unknown direction {row['direction']!r}")


def check_row(row: dict) -> None:
    assert row.keys() == KEYS, sorted(row.keys() ^ KEYS)
    assert row["baseline"] > 0 and row["ours"] > 0, row
    assert isinstance(row["repeats"], int) and row["repeats"] >= 1, row
    assert len(row["scenario"]) > 40 and "baseline" in row["scenario"], row  # stated, not a stub
    for median, spread in ((row["baseline"], row["baseline_spread"]),
                           (row["ours"], row["ours_spread"])):  # fmt: skip
        assert len(spread) == 2 and spread[0] <= median <= spread[1], row
        if row["repeats"] == 1:  # one measurement: no spread
            assert spread[0] == spread[1] == median, row
    ratio, met = expected_ratio_and_met(row)
    assert row["ratio"] == pytest.approx(ratio, rel=1e-9), row
    assert row["met"] is met, row


def test_every_benchmark_is_run_by_the_suite():
    from bench.run_all import BENCHMARKS

    assert list(BENCHMARKS) == list(ROWS)


SCENARIO = "a stated scenario; baseline: what a user would otherwise run"


@pytest.mark.parametrize(
    ("baseline", "ours", "direction", "target", "ratio", "met"),
    [
        (2.0, 1.0, "baseline/ours", 1.5, 2.0, True),
        (2.0, 1.0, "baseline/ours", 3.0, 2.0, False),  # better than the baseline, not enough
        (4.0, 3.0, "ours/baseline", 0.9, 0.75, False),
        (4.0, 3.6, "ours/baseline", 0.9, 0.9, True),
        (1.2, 1.1, "ours<=target", 1.05, 1.2 / 1.1, False),  # ratio above the target: not met
        (1.2, 1.0, "ours<=target", 1.05, 1.2, True),
    ],
)  # fmt: skip
def test_result_computes_ratio_and_met_from_its_numbers(baseline, ours, direction, target, ratio,
                                                        met):  # fmt: skip
    from bench.common import Result

    # three repetitions without spread: the medians decide
    row = Result.of("x", "s", [baseline] * 3, [ours] * 3, direction, target, "machine", SCENARIO)
    assert row.ratio == pytest.approx(ratio) and row.met is met
    assert row.repeats == 3 and row.baseline_spread == (baseline, baseline)


@pytest.mark.parametrize(
    ("baselines", "ours", "direction", "target", "ratio", "met"),
    [
        # medians 2.0 / 1.0 reach 1.5, but the worst case, 1.6 / 1.2 = 1.33, does not
        ([1.6, 2.0, 2.2], [0.9, 1.0, 1.2], "baseline/ours", 1.5, 2.0, False),
        ([1.9, 2.0, 2.2], [0.9, 1.0, 1.2], "baseline/ours", 1.5, 2.0, True),  # 1.58 beyond
        # medians 3.6 / 4.0 = 0.9 reach 0.9; the worst case, 3.0 / 4.4, does not
        ([3.9, 4.0, 4.4], [3.0, 3.6, 3.7], "ours/baseline", 0.9, 0.9, False),
        ([3.9, 4.0, 4.0], [3.6, 3.6, 3.7], "ours/baseline", 0.9, 0.9, True),
        # ours' median 1.0 is under the ceiling 1.05; its highest, 1.1, is not
        ([1.2, 1.2, 1.2], [0.9, 1.0, 1.1], "ours<=target", 1.05, 1.2, False),
        ([1.2, 1.2, 1.2], [0.9, 1.0, 1.04], "ours<=target", 1.05, 1.2, True),
        # far beyond the target but measured twice: unknown spread, not met
        ([9.0, 9.0], [1.0, 1.0], "baseline/ours", 1.5, 9.0, False),
    ],
)  # fmt: skip
def test_met_needs_the_target_beyond_the_spread(baselines, ours, direction, target, ratio, met):
    from bench.common import Result

    row = Result.of("x", "s", baselines, ours, direction, target, "machine", SCENARIO)
    assert row.ratio == pytest.approx(ratio) and row.met is met
    assert row.baseline_spread == (min(baselines), max(baselines))
    assert row.ours_spread == (min(ours), max(ours)) and row.repeats == len(ours)
    check_row(asdict(row))


def test_result_refuses_an_unknown_direction_a_missing_scenario_or_a_median_off_its_spread():
    from bench.common import Result

    with pytest.raises(ValueError, match="direction"):
        Result.of("x", "s", [1.0], [1.0], "ours/target", 1.0, "machine", SCENARIO)
    with pytest.raises(ValueError, match="scenario"):
        Result.of("x", "s", [1.0], [1.0], "baseline/ours", 1.0, "machine", " ")
    with pytest.raises(ValueError, match="spread"):
        Result("x", "s", 2.0, 1.0, "baseline/ours", 1.0, "machine", scenario=SCENARIO,
               repeats=3, baseline_spread=(2.5, 3.0), ours_spread=(1.0, 1.0))  # fmt: skip


# Benchmarks whose quick run takes seconds: CI runs them; the others (each starts launch.sh or
# an engine, some of them several times) are in the extended tier (tests/conftest.py).
# e2e_vs_trl's (78 s) is extended: CI checks TRL's arguments are the workload's instead
# (tests/test_bench_vs_trl.py), the quick run checks what both sides recorded.
QUICK_IN_CI = {"transport", "logprobs", "weight_fanout"}


def quick_marks(name: str) -> list[pytest.MarkDecorator]:
    marks = [] if name in QUICK_IN_CI else [pytest.mark.extended]
    return marks + ([pytest.mark.xdist_group("embedded_model")] if name == "vllm" else [])


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=quick_marks(n)) for n in ROWS])
def test_benchmark_runs_quick(tmp_path, name):
    env = {**os.environ, "BENCH_RESULTS": str(tmp_path)}
    command = [sys.executable, "-m", "bench.run_all", "--quick", "--only", name]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == (ROWS[name] if name != "vllm" or HAS_VLLM else 0), [f.name for f in files]
    rows = {f.stem: json.loads(f.read_text()) for f in files}
    for row in rows.values():
        check_row(row)
        assert row["quick"] is True
    if name == "padding":
        # counted, not timed, so exact even at quick sizes: packed, the model is fed the real
        # tokens and nothing else; padded, more
        tokens = rows["padding_tokens_computed_per_real"]
        assert tokens["ours_spread"] == [1.0, 1.0] and tokens["baseline"] > 1.0, tokens


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.stem)
def test_committed_result_is_consistent_and_full_size(path):
    row = json.loads(path.read_text())
    assert row["name"] == path.stem
    check_row(row)
    assert row["quick"] is False, f"{path.name} is from a --quick run: not a result"


def benchmark_of(stem: str) -> str:
    """The benchmark that writes row `stem`: the longest name it starts with (e2e_vs_trl_...
    is not e2e's)."""
    return max((name for name in ROWS if stem.startswith(f"{name}_")), key=len, default="")


def test_committed_results_are_the_rows_the_benchmarks_write():
    """One file per row, no stale rows of a benchmark that writes others now."""
    for name, count in ROWS.items():
        written = [p.name for p in COMMITTED if benchmark_of(p.stem) == name]
        assert len(written) == count, (name, written)
    assert len(COMMITTED) == sum(ROWS.values())


def test_e2e_busy_share_counts_generation_and_training():
    """The busy share (e2e_busy_share, a row until 2026-11-28) is at most 1 by construction in
    a synchronous run: its arithmetic is this test, not a benchmark row."""
    from bench.e2e import busy_and_wall

    # metrics rows: the first step's end starts the clock; 2 steps of 10 s after it
    rows = [{"time": 100.0, "sampler_gen_s": 50.0, "train_s": 50.0}]
    rows += [{"time": 110.0, "sampler_gen_s": 4.0, "train_s": 5.0},
             {"time": 120.0, "sampler_gen_s": 3.0, "train_s": 4.0}]  # fmt: skip
    assert busy_and_wall(rows) == pytest.approx((8.0, 10.0))


def test_docs_table_is_generated_from_the_committed_results():
    from bench import table

    expected = table.render()
    actual = table.in_page(table.PAGE.read_text(encoding="utf-8"))
    if actual != expected:
        diff = difflib.unified_diff(
            actual.splitlines(), expected.splitlines(), "docs/benchmarks.md",
            "bench.table.render()", lineterm="",
        )  # fmt: skip
        pytest.fail("docs/benchmarks.md's table is not the one generated from bench/results/; "
                    "regenerate it with\n    .venv/bin/python -m bench.table\n"
                    + "\n".join(diff))  # fmt: skip


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
    for written in (row, gen):  # tokens/s of both KV caches; FLOP/s of the card and the model
        check_row(written)
        assert written["quick"] is True


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
