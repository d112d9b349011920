"""The sampler's one generation loop (grpo.sampler.generation) under both pacings
(grpo.sampler.pacing), driving an engine written outside grpo/ to the slot interface
(tests/plugins/toy_engine.py), with the real shard, rewards and batch maker; the trainer's
side is a stand-in that has published every version a batch may need. The whole pipeline runs
these pacings with the HF engine in tests/test_integration.py and tests/test_continuous_runs.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from grpo.config import load_config
from grpo.core.episode import EpisodeBatch
from grpo.core.staleness import required_version
from grpo.models.loading import load_tokenizer
from grpo.rollout.base import EngineContext
from grpo.rollout.registry import build_engine
from grpo.runtime.progress import ACTIVITY, Snapshot
from grpo.sampler.data import Shard
from grpo.sampler.episodes import BatchMaker
from grpo.sampler.generation import GenerationLoop
from grpo.sampler.pacing import pacing_for
from grpo.sampler.rewards import SamplerRewards
from grpo.tasks import task_for
from grpo.weights.version import Version
from tests.plugins.toy_engine import ToyEngine

TOY = "tests.plugins.toy_engine:build"
TASK = "tests.plugins.toy_task:TASK"
Q, G, BATCHES = 2, 3, 5


class Published:
    """The sampler's weights as the loop sees them, with every version out: a lone sampler
    loads exactly the version its next batch needs."""

    def __init__(self) -> None:
        self.version = 0
        self.reload_s = 0.0
        self.engine = None

    def serve(self, needed) -> int:
        number = needed()
        if number != self.version:
            assert self.engine is not None
            self.engine.load(Version(number, False))
            self.version = number
        return self.version

    def stats(self) -> dict[str, float]:
        return {}


def no_policy():
    raise AssertionError("the toy engine samples without a model")


def run_loop(tokenizer, mode: str, *overrides: str) -> tuple[list[EpisodeBatch], Any]:
    """BATCHES batches from the loop, as a lone sampler whose batches are trained as they come;
    and the engine."""
    cfg = load_config(None, [
        f"rollout.backend={TOY}", f"data.task={TASK}", "data.reward=", f"rollout.mode={mode}",
        "train.logprobs_on=trainer", f"rollout.questions_per_step={Q}",
        f"rollout.group_size={G}", "rollout.max_new_tokens=6", "reward.workers=1",
        f"train.total_steps={BATCHES}", *overrides,
    ])  # fmt: skip
    task = task_for(cfg)
    shard = Shard(cfg, task, tokenizer)
    weights = Published()
    rewards = SamplerRewards(cfg, task)
    try:
        batches = BatchMaker(cfg, tokenizer, rewards, shard, weights, None)  # type: ignore[arg-type]
        engine = build_engine(
            EngineContext(
                cfg, None, tokenizer, threading.Event(), SimpleNamespace(module=no_policy)
            )
        )  # type: ignore[arg-type]
        weights.engine = engine
        loop = GenerationLoop(cfg, shard, batches, weights, pacing_for(cfg))  # type: ignore[arg-type]
        sent: list[EpisodeBatch] = []
        run = SimpleNamespace(  # a RunView
            next_batch=lambda: (len(sent), 1),
            groups_wanted=lambda: (BATCHES - len(sent)) * Q,
            wait_for_room=lambda: None,
            send=sent.append,
            stopped=lambda: False,
        )
        assert loop.run(engine, run, 0) == BATCHES
    finally:
        rewards.close()
    return sent, engine


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def groups(batch: EpisodeBatch) -> Iterator[list]:
    for k in range(0, len(batch.episodes), G):
        yield batch.episodes[k : k + G]


@pytest.mark.parametrize("mode", ["lockstep", "continuous"])
def test_a_slot_engine_of_your_own_runs_both_pacings(tokenizer, mode):
    lag = 2  # continuous: versions load after each cut, under the next batches' answers
    overrides = (f"train.max_staleness={lag}", "algo.rollout_correction=decoupled",
                 f"rollout.slots={2 * Q * G}", "train.keep_versions=4")  # fmt: skip
    sent, engine = run_loop(tokenizer, mode, *overrides)
    assert isinstance(engine, ToyEngine)  # a slot engine is driven as it is
    assert [b.seq for b in sent] == list(range(BATCHES))
    for b in sent:
        assert len(b.episodes) == Q * G
        assert b.policy_version >= required_version(b.seq, lag, 1)  # the staleness bound
        for group in groups(b):
            assert len({e.group_id for e in group}) == 1
            # Each answer sampled from its own seed: a group's answers are not copies.
            assert len({tuple(e.completion_ids) for e in group}) > 1, group
        for e in b.episodes:
            assert e.rollout_logp is not None and np.allclose(e.rollout_logp, -np.log(64))
            assert e.token_versions is not None and e.token_versions.min() >= b.policy_version
    if mode == "lockstep":  # one version per batch, loaded with the engine empty
        assert engine.loaded == [1, 2]  # batches 3 and 4 need versions 1 and 2
        assert engine.changed_under == [0, 0]
        assert all(len(set(np.concatenate([e.token_versions for e in b.episodes]))) == 1
                   for b in sent)  # fmt: skip
    else:  # after each cut, the version the batch after next needs, under the answers in flight
        assert engine.loaded == [1, 2, 3, 4]
        assert max(engine.changed_under) > 0, engine.changed_under
    questions = [e.group_id for b in sent for e in b.episodes[::G]]
    assert len(set(questions)) == len(questions) == Q * BATCHES  # each question drawn once
    # Deterministic: the same run samples the same answers.
    again, _ = run_loop(tokenizer, mode, *overrides)
    for a, b in zip(sent, again, strict=True):
        assert [e.completion_ids.tolist() for e in a.episodes] == [
            e.completion_ids.tolist() for e in b.episodes
        ]


@pytest.mark.parametrize(
    "factory, mode",
    [("build", "lockstep"), ("build_slots", "lockstep"), ("build_slots", "continuous")],
)
def test_tools_under_both_pacings(tokenizer, factory, mode):
    """The scripted calculator engine (tests/plugins/tool_engine.py), whole-batch (under
    grpo.rollout.multi_turn) and written to slots (under grpo.rollout.tool_slots): each group
    holds a call, a failing call and a direct answer, masked and counted as the engine's
    script says, in batches of either pacing."""
    backend = f"tests.plugins.tool_engine:{factory}"
    sent, _ = run_loop(tokenizer, mode, f"rollout.backend={backend}", "rollout.max_turns=3",
                       "rollout.tools=[calculator]", "rollout.max_new_tokens=64",
                       "train.max_staleness=0")  # fmt: skip
    assert len(sent) == BATCHES
    for b in sent:
        for group in groups(b):
            info = sorted((e.reward_info["tool_calls"], e.reward_info["turns"]) for e in group)
            assert info == [(0, 1), (1, 2), (1, 2)], info
            for e in group:
                assert e.loss_mask is not None
                assert (e.loss_mask == 0).any() == (e.reward_info["tool_calls"] == 1)


def test_lock_step_fills_an_engine_smaller_than_its_batch_as_slots_free_up(tokenizer):
    """An engine with room for one group makes the same lock-step batches as one with room for
    all: a batch's groups go in as slots free up, each answer from its own seed, one version."""
    small, engine = run_loop(tokenizer, "lockstep", f"rollout.slots={G}")
    assert engine.slots == G
    large, _ = run_loop(tokenizer, "lockstep", f"rollout.slots={Q * G}")
    for a, b in zip(small, large, strict=True):
        assert [e.completion_ids.tolist() for e in a.episodes] == [
            e.completion_ids.tolist() for e in b.episodes
        ]
        assert a.policy_version == b.policy_version


def test_each_step_is_progress_in_generating_the_batch_being_made(tokenizer, monkeypatch):
    """What a heartbeat carries while the loop steps an engine that reports nothing itself: the
    phase names the batch being made (the pool's stall message quotes it) and every step moves
    the counter the stall check watches."""
    seen: list[Snapshot] = []
    step = ToyEngine.step

    def watched(self):
        seen.append(ACTIVITY.snapshot())
        return step(self)

    monkeypatch.setattr(ToyEngine, "step", watched)
    run_loop(tokenizer, "lockstep")
    assert {s.describe() for s in seen} == {f"generating (batch {b})" for b in range(BATCHES)}
    counts = [s.count for s in seen]
    assert all(b > a for a, b in zip(counts, counts[1:], strict=False)), counts
