"""A rollout engine added by writing one file outside grpo/ (tests/plugins/toy_engine.py) and
naming it in the config: built through the registry, then driving the real pipeline."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from grpo.rollout.base import EngineContext, Sampling
from grpo.rollout.registry import ENGINES, get_engine, register_engine
from tests.conftest import run_launch, transport_overrides
from tests.test_integration import tiny_config

TOY = "tests.plugins.toy_engine:build"


def _toy_engine(stop_event: threading.Event | None = None):
    # What the toy reads of a tokenizer; the rest of the context it ignores.
    tokenizer = SimpleNamespace(eos_token_id=2, vocab_size=1000, all_special_ids=[0, 1, 2])

    def no_policy():
        raise AssertionError("the toy engine samples without a model")

    ctx = EngineContext(None, None, tokenizer, stop_event or threading.Event(), no_policy)
    return get_engine(TOY)(ctx)


def test_toy_engine_built_by_name_answers_in_contiguous_groups():
    engine = _toy_engine()
    prompts = [np.arange(k + 3, dtype=np.int32) for k in range(3)]
    gens = engine.generate(prompts, Sampling(n=4, max_new_tokens=8, seed=7))
    assert len(gens) == 3 * 4
    for i, g in enumerate(gens):
        assert np.array_equal(g.prompt_ids, prompts[i // 4])  # prompt 0's answers first
        assert g.prompt_ids.dtype == g.completion_ids.dtype == np.int32
        assert g.rollout_logp is not None and g.rollout_logp.dtype == np.float32
        assert g.rollout_logp.shape == g.completion_ids.shape
        assert np.allclose(g.rollout_logp, -np.log(64))
        assert 1 <= len(g.completion_ids) <= 8 and (g.completion_ids < 1000).all()
        if g.finish_reason == "stop":
            assert g.completion_ids[-1] == 2 and 2 not in g.completion_ids[:-1]
        else:
            assert g.finish_reason == "length" and len(g.completion_ids) == 8
            assert 2 not in g.completion_ids
    assert {g.finish_reason for g in gens} == {"stop", "length"}
    # Seeded: the same call gives the same answers.
    again = engine.generate(prompts, Sampling(n=4, max_new_tokens=8, seed=7))
    assert all(
        np.array_equal(a.completion_ids, b.completion_ids) for a, b in zip(gens, again, strict=True)
    )

    engine.load_version(None, 3)
    assert engine.version == 3
    engine.close()


def test_an_engine_registered_under_a_short_name():
    from tests.plugins.toy_engine import build

    try:
        assert register_engine("toy", build) is build and get_engine("toy") is build
        with pytest.raises(ValueError, match="already registered"):
            register_engine("hf", build)
    finally:
        ENGINES.remove("toy")


def test_toy_engine_stops_when_told():
    stop = threading.Event()
    engine = _toy_engine(stop)
    stop.set()
    prompts = [np.arange(3, dtype=np.int32)] * 2
    assert engine.generate(prompts, Sampling(n=2, max_new_tokens=4)) == []


@pytest.mark.slow
def test_toy_engine_runs_the_pipeline(tmp_path, tiny_model_dir):
    """Two steps with the toy sampling: the sampler scores its answers, the trainer trains."""
    config = tiny_config(
        tmp_path,
        tiny_model_dir,
        rollout={"backend": TOY},
        # two passes over each batch: the old-policy pass runs (grpo.config.passes)
        train={"total_steps": 2, "num_ranks": 1, "ppo_epochs": 2},
    )
    proc = run_launch(config, transport_overrides(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    metrics = tmp_path / "runs" / "tiny" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # The engine's log-probs reached the trainer next to the sampler's old ones.
    assert all("rollout_vs_old_logp_abs_diff" in r for r in rows), rows[0].keys()
    assert "reloaded weights: version 0 -> 1" in log
