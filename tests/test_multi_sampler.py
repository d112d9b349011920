"""Two samplers feed one trainer: disjoint shards of the dataset, per-sampler metrics."""

from __future__ import annotations

import json

import pytest

from tests.conftest import transport_overrides
from tests.test_chaos import finish, start
from tests.test_integration import _assert_no_stray_processes, tiny_config

pytestmark = pytest.mark.slow


def test_two_samplers_feed_one_trainer_from_disjoint_shards(tmp_path, tiny_model_dir):
    train = {"total_steps": 4, "max_staleness": 1, "num_ranks": 1}
    config = tiny_config(tmp_path, tiny_model_dir, train=train)
    overrides = [*transport_overrides(), "rollout.num_samplers=2"]
    procs = [start("trainer", config, overrides, tmp_path / "trainer.log")]
    for i in (0, 1):
        mine = [f"rollout.sampler_index={i}", f"rollout.sampler_id=sampler-{i}"]
        procs.append(start("sampler", config, [*overrides, *mine], tmp_path / f"s{i}.log"))
    finish(procs, timeout=600)
    assert [p.returncode for p in procs] == [0, 0, 0], (tmp_path / "trainer.log").read_text()[
        -3000:
    ]
    run_dir = tmp_path / "runs" / "tiny"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted((r["sampler_id"], r["batch_seq"]) for r in rows) == [
        ("sampler-0", 0), ("sampler-0", 1), ("sampler-1", 0), ("sampler-1", 1),
    ]  # fmt: skip
    # Shard i holds rows i, i + 2, ...: the group ids (row indices) say whose a batch is.
    for r in rows:
        gids = {g for rank in r["rank_group_ids"] for g in rank}
        assert {g % 2 for g in gids} == {int(r["sampler_id"][-1])}, r["rank_group_ids"]
    summary = json.loads((run_dir / "samplers.json").read_text())
    assert {sid: s["batches"] for sid, s in summary.items()} == {"sampler-0": 2, "sampler-1": 2}
    _assert_no_stray_processes(config)
