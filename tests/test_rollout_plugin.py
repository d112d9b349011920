"""A rollout engine added by writing one file outside grpo/ (tests/plugins/toy_engine.py) and
naming it in the config: built through the registry. Its run through the real pipeline, with
the toy loss and task, is tests/test_plugins.py's."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from grpo.config import load_config
from grpo.rollout.base import EngineContext
from grpo.rollout.registry import ENGINES, get_engine, register_engine
from grpo.rollout.slots import SlotRequest
from grpo.weights.version import Version

TOY = "tests.plugins.toy_engine:build"


def _toy_engine(stop_event: threading.Event | None = None):
    # What the toy reads of a tokenizer and the config; the rest of the context it ignores.
    tokenizer = SimpleNamespace(eos_token_id=2, vocab_size=1000, all_special_ids=[0, 1, 2])
    cfg = load_config(None, ["rollout.questions_per_step=3", "rollout.group_size=4"])

    def no_policy():
        raise AssertionError("the toy engine samples without a model")

    ctx = EngineContext(
        cfg, None, tokenizer, stop_event or threading.Event(), SimpleNamespace(module=no_policy)
    )
    return get_engine(TOY)(ctx)


def _requests(seed: int = 7) -> list[SlotRequest]:
    prompts = [np.arange(k + 3, dtype=np.int32) for k in range(3)]
    return [
        SlotRequest(4 * k + j, prompts[k], seed + 4 * k + j, 8) for k in range(3) for j in range(4)
    ]


def _until_done(engine) -> list:
    finished = []
    while engine.in_flight():
        finished += engine.step()
    return finished


def test_toy_engine_built_by_name_decodes_in_its_slots():
    engine = _toy_engine()
    assert engine.slots == 12 and engine.free_slots() == list(range(12))
    answers = engine.admit(_requests())
    assert [a.slot for a in answers] == list(range(12)) and engine.free_slots() == []
    engine.load(Version(3, False))
    finished = _until_done(engine)
    assert sorted(a.request.uid for a in finished) == list(range(12))
    assert engine.free_slots() == list(range(12))
    for a in answers:
        g = a.generation()
        assert g.prompt_ids.dtype == g.completion_ids.dtype == np.int32
        assert g.rollout_logp is not None and np.allclose(g.rollout_logp, -np.log(64))
        assert list(g.token_versions) == [3] * len(g.completion_ids)
        assert 1 <= len(g.completion_ids) <= 8 and (g.completion_ids < 1000).all()
        if g.finish_reason == "stop":
            assert g.completion_ids[-1] == 2 and 2 not in g.completion_ids[:-1]
        else:
            assert g.finish_reason == "length" and len(g.completion_ids) == 8
            assert 2 not in g.completion_ids
    assert {a.finish_reason for a in answers} == {"stop", "length"}
    # Seeded per answer: the same requests give the same answers, in any company.
    again = _toy_engine()
    alone = again.admit(_requests()[5:6])
    _until_done(again)
    assert alone[0].tokens == answers[5].tokens

    engine.load(Version(4, False))
    assert engine.loaded == [3, 4] and engine.version == 4
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
    engine.admit(_requests()[:4])
    stop.set()
    assert engine.step() == [] and all(a.tokens == [] for a in engine.in_flight())
