"""A rollout engine added by writing one file outside grpo/ (tests/plugins/toy_engine.py) and
naming it in the config: built through the registry. Its run through the real pipeline, with
the toy loss and task, is tests/test_plugins.py's."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from grpo.rollout.base import EngineContext, Sampling
from grpo.rollout.registry import ENGINES, get_engine, register_engine
from grpo.weights.version import Version

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

    engine.load(Version(3, False))
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
