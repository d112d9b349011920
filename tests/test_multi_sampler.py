"""Samplers as a pool: three feed one trainer from disjoint shards of the dataset; one is
SIGKILLed and one hangs in generation, and the run still trains every step from the one left,
naming the two it dropped and what each was last doing. Each sampler's first reward call hangs
too, and costs one answer's score. And the pool is elastic: a sampler started during the run
joins and is trained from, one that leaves says so, and the metrics row shows the pool."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from bench.common import kill_tree
from tests.conftest import transport_overrides
from tests.plugins.hanging_engine import HANG_AT
from tests.test_chaos import finish, rows_of, start, wait_for
from tests.test_integration import _assert_no_stray_processes, tiny_config

pytestmark = pytest.mark.slow

STEPS = 10
STALL_S = 3


@pytest.mark.extended  # CI leaves it out; the pool's bookkeeping: test_pool.py
def test_a_killed_and_a_hung_sampler_are_dropped_by_name_and_the_pool_finishes(
    tmp_path, tiny_model_dir
):
    train = {"total_steps": STEPS, "num_ranks": 1}
    config = tiny_config(
        tmp_path, tiny_model_dir, train=train,
        data={"reward": "tests.rewards_for_tests:first_call_hangs"},
        reward={"timeout_s": 1.5},
    )  # fmt: skip
    overrides = [
        *transport_overrides(timeout_s=4),
        f"transport.stall_timeout_s={STALL_S}",
        "rollout.num_samplers=3",
    ]
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "s0", "s1", "s2")}
    trainer = start("trainer", config, overrides, logs["trainer"])
    samplers = []
    for i in range(3):
        mine = [f"rollout.sampler_index={i}", f"rollout.sampler_id=sampler-{i}"]
        env = None
        if i == 2:  # its second generate call never returns
            mine.append("rollout.backend=tests.plugins.hanging_engine:build")
            env = {HANG_AT: "1"}
        samplers.append(start("sampler", config, [*overrides, *mine], logs[f"s{i}"], env))
    run_dir = tmp_path / "runs" / "tiny"
    procs = [trainer, *samplers]

    def trained_from(sid: str) -> int:
        return sum(r["sampler_id"] == sid for r in rows_of(run_dir))

    wait_for(lambda: trained_from("sampler-1") >= 1, "a batch of sampler-1", procs)
    killed_at = time.monotonic()
    kill_tree(samplers[1])
    finish([trainer, samplers[0], samplers[2]], timeout=400)
    text = {r: p.read_text() for r, p in logs.items()}
    assert trainer.returncode == 0, text["trainer"][-3000:]
    assert samplers[0].returncode == 0, text["s0"][-3000:]
    assert samplers[2].returncode == 1, text["s2"][-3000:]

    # Both dropped by name, with what each was doing; the hung one also says so itself.
    silent = re.search(
        r"sampler sampler-1 dropped: silent for (\d+) s \(limit 4 s\); last seen (\w+)",
        text["trainer"],
    )
    assert silent, text["trainer"][-3000:]
    stall = f"no progress in generating (batch 1) for {STALL_S} s (limit {STALL_S} s)"
    # Its own stop message, or the trainer's stall clock first (the same limit, so a race).
    assert re.search(f"sampler sampler-2 (stopped|dropped): {re.escape(stall)}", text["trainer"])
    assert f"sampler sampler-2: {stall}" in text["s2"]
    assert "exiting: sampler sampler-2" in text["s2"]
    ended_s = time.monotonic() - killed_at
    for line in text["trainer"].splitlines():  # for the record (pytest -s)
        if "sampler-1 dropped" in line or "sampler-2 " in line:
            print(line)
    print(f"the run ended {ended_s:.0f} s after sampler-1 was killed")

    # Every step trained once, no batch twice, and each sampler's batches from its own shard.
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    batches = [(r["sampler_id"], r["batch_seq"]) for r in rows]
    assert len(set(batches)) == STEPS, batches
    assert trained_from("sampler-2") == 1  # batch 0; batch 1 never came
    # Each sampler's hung reward call: one answer of its first batch scored 0, named.
    first = {r["sampler_id"]: r for r in sorted(rows, key=lambda r: -r["batch_seq"])}
    for sid in ("sampler-0", "sampler-2"):
        assert first[sid]["batch_seq"] == 0 and first[sid]["reward_timeouts"] == 1, first[sid]
    assert sum(r["reward_timeouts"] for r in rows) <= 3
    for r in rows:
        gids = {g for rank in r["rank_group_ids"] for g in rank}
        assert {g % 3 for g in gids} == {int(r["sampler_id"][-1])}, r["rank_group_ids"]
    summary = json.loads((run_dir / "samplers.json").read_text())
    assert sum(s["batches"] for s in summary.values()) == STEPS
    _assert_no_stray_processes(config)


@pytest.mark.xdist_group("crash_tests")  # beside the other multi-process runs
def test_a_sampler_joins_mid_run_and_one_leaves_and_every_step_is_trained(tmp_path, tiny_model_dir):
    """The pool grows and shrinks during a run (rollout.num_samplers: the shards planned, not
    the samplers started): sampler-1 starts after step 3, gets the current version and its
    batches are trained; sampler-0 then leaves (SIGTERM), saying so; the run trains every step
    once from whoever is there, and the metrics row's samplers_alive follows the pool."""
    steps = 16  # ~1.5 s each (a reward of 50 ms a call): sampler-1 starts in about 8
    config = tiny_config(tmp_path, tiny_model_dir, train={"total_steps": steps, "num_ranks": 1},
                         data={"reward": "tests.rewards_for_tests:slow_text_length"})  # fmt: skip
    overrides = [*transport_overrides(timeout_s=60), "rollout.num_samplers=2"]
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "s0", "s1")}

    def sampler(i: int):
        mine = [f"rollout.sampler_index={i}", f"rollout.sampler_id=sampler-{i}"]
        return start("sampler", config, [*overrides, *mine], logs[f"s{i}"])

    run_dir = tmp_path / "runs" / "tiny"
    trainer, s0 = start("trainer", config, overrides, logs["trainer"]), sampler(0)
    try:
        wait_for(lambda: len(rows_of(run_dir)) >= 3, "step 3", [trainer, s0])
        # ROLE=sampler execs: s0 is the sampler itself. Frozen while sampler-1 starts (up to
        # 20 s on a loaded machine), sampler-0 cannot carry the run to its end before it
        # leaves; it leaves as soon as it is let go again (the SIGTERM waits for the SIGCONT).
        s0.send_signal(signal.SIGSTOP)
        s1 = sampler(1)
        wait_for(lambda: any(r["sampler_id"] == "sampler-1" for r in rows_of(run_dir)),
                 "a batch of sampler-1", [trainer, s0, s1])  # fmt: skip
        s0.send_signal(signal.SIGTERM)
        s0.send_signal(signal.SIGCONT)
        finish([trainer, s0, s1], timeout=400)
    finally:
        finish([trainer, s0, *([s1] if "s1" in locals() else [])], timeout=1)
    text = {r: p.read_text() for r, p in logs.items()}
    assert trainer.returncode == 0 and s1.returncode == 0, text["trainer"][-3000:]
    assert s0.returncode == 130, text["s0"][-3000:]
    assert "sampler sampler-0 stopped: interrupted by SIGTERM" in text["trainer"]
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert len({(r["sampler_id"], r["batch_seq"]) for r in rows}) == steps
    joined = next(r for r in rows if r["sampler_id"] == "sampler-1")
    assert joined["step"] > 3 and joined["policy_version"] >= 3, joined  # the current version
    pool = [r["samplers_alive"] for r in rows]
    assert pool[0] == 1 and 2 in pool and pool[-1] == 1, pool
    print("\nelastic pool: step, samplers alive, sampler, seconds since the last step")
    for before, r in zip([rows[0], *rows], rows, strict=False):
        print(f"  {r['step']:2d}  {r['samplers_alive']}  {r['sampler_id']}  "
              f"{r['time'] - before['time']:.1f}")  # fmt: skip
    _assert_no_stray_processes(config)
