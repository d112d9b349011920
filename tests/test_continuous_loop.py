"""The continuous pacing's batch cut (grpo.sampler.pacing.Continuous): admission order, and the
discards of several samplers with their lengths in the metrics. The engine and the batch maker
are stand-ins that record what the cut asks of them; the real ones run in
tests/test_continuous_runs.py."""

from __future__ import annotations

import numpy as np
import pytest

from grpo.config import load_config
from grpo.rollout.slots import Answer, SlotRequest
from grpo.sampler.episodes import Group
from grpo.sampler.generation import Admitted, GenerationLoop
from grpo.sampler.pacing import Continuous
from grpo.tasks.encoding import Prompt


class Engine:
    slots = 8

    def __init__(self) -> None:
        self.rebuilds = 0

    def in_flight(self) -> list[Answer]:
        return []

    def rebuild_cache(self) -> None:
        self.rebuilds += 1


class Batches:
    def batch(self, seq, groups, version, stats):
        return seq, [g.prompt.index for g in groups], version, stats


def admitted(index: int, versions: list[list[int]], scored: bool = True) -> Admitted:
    """A group of question `index`, its answers' tokens of these versions (one list each)."""
    prompt = Prompt(index, {}, np.zeros(3, np.int32), position=index)
    answers = [
        Answer(
            SlotRequest(10 * index + k, prompt.ids, 0, 64),
            k,
            list(range(len(v))),
            [0.0] * len(v),
            v,
            "stop" if scored else None,
        )  # fmt: skip
        for k, v in enumerate(versions)
    ]
    g = Admitted(prompt, answers, min(min(v) for v in versions), drawn=(index, index + 1))
    if scored:
        g.group = Group(prompt, [a.generation() for a in answers], [(0.0, {})] * len(answers))
    return g


class Cut:
    """The pacing's cut on a loop holding `groups`."""

    def __init__(self, groups: list[Admitted], *overrides: str):
        base = ["rollout.mode=continuous", "rollout.questions_per_step=2", "rollout.group_size=2"]
        cfg = load_config(None, [*base, "train.max_staleness=0", *overrides])
        self.pacing = Continuous(cfg)
        self.loop = GenerationLoop(cfg, None, Batches(), None, self.pacing)  # type: ignore[arg-type]
        self.loop.groups = groups

    @property
    def groups(self) -> list[Admitted]:
        return self.loop.groups

    def cut(self, engine: Engine, seq: int, batch: int):
        self.loop.seq = seq
        return self.pacing.cut_at(self.loop, engine, batch)  # type: ignore[arg-type]


def test_a_batch_is_its_first_groups_in_admission_order_once_they_are_all_scored():
    loop = Cut([admitted(0, [[3], [3]], scored=False), admitted(1, [[3], [3]]),
                      admitted(2, [[3], [3]])])  # fmt: skip
    engine = Engine()
    assert loop.cut(engine, seq=0, batch=3) is None  # group 0 still decoding holds its batch
    assert len(loop.groups) == 3 and engine.rebuilds == 0
    loop.groups[0] = admitted(0, [[3, 3], [3]])
    seq, questions, version, stats = loop.cut(engine, seq=0, batch=3)
    assert questions == [0, 1] and version == 3 and engine.rebuilds == 1
    assert [g.prompt.index for g in loop.groups] == [2]
    assert stats["groups_discarded"] == 0 and (stats["data_start"], stats["data_end"]) == (0, 2)


def test_groups_past_their_bound_are_discarded_and_their_lengths_reported():
    """Several samplers: batch 5 needs version 5 (no lag); group 1's oldest token is version
    4, so it is dropped, group 2 takes its place, and the lengths of both kinds show."""
    loop = Cut([admitted(0, [[5, 5], [5]]), admitted(1, [[4, 5, 5, 5], [5, 5, 5]]),
                      admitted(2, [[5], [6]])], "rollout.num_samplers=2")  # fmt: skip
    _, questions, version, stats = loop.cut(Engine(), seq=0, batch=5)
    assert questions == [0, 2] and version == 5 and loop.groups == []
    assert stats["groups_discarded"] == 1 and stats["answers_discarded_total"] == 2
    assert stats["answer_len_discarded_mean"] == 3.5
    assert stats["answer_len_trained_mean"] == 1.25


def test_without_exact_resume_a_cut_rebuilds_no_cache():
    loop = Cut([admitted(0, [[0], [0]]), admitted(1, [[0], [0]])], "rollout.exact_resume=false")
    engine = Engine()
    assert loop.cut(engine, seq=0, batch=0) is not None and engine.rebuilds == 0


@pytest.mark.parametrize(("lag", "ahead"), [(0, 1), (1, 1), (2, 2), (3, 2)])
def test_after_a_cut_the_version_loaded_is_the_one_a_batch_ahead_needs(lag, ahead):
    """After the cut of batch b the sampler loads the version batch b + 2 needs, b + 1 below a
    lag of 2: at a lag of 1, b + 2 needs version b + 1, which only batch b's training makes (the
    sampler would wait for it with its slots idle). Lags 1 and 3 besides the 0 and 2 every run
    uses."""
    settings = ["rollout.mode=continuous", f"train.max_staleness={lag}",
                "algo.rollout_correction=decoupled", "train.keep_versions=8"]  # fmt: skip
    cfg = load_config(None, settings)
    assert Continuous(cfg).ahead == ahead


def test_a_group_lands_in_the_batch_its_place_and_the_live_samplers_say():
    """With n samplers the run's batches move n at a time: this sampler's k-th batch of groups
    is the run's batch first + k * n (exact for one sampler, an estimate for several)."""
    cfg = load_config(None, ["rollout.mode=continuous", "rollout.questions_per_step=2",
                             "train.max_staleness=0"])  # fmt: skip
    pacing = Continuous(cfg)
    assert [pacing.landing(n, 5, 1) for n in range(5)] == [5, 5, 6, 6, 7]
    assert [pacing.landing(n, 5, 3) for n in range(5)] == [5, 5, 8, 8, 11]
    assert pacing.landing(2, 5, 0) == 6  # no sampler counted yet: as one


def test_the_paced_share_is_of_the_loop_s_steps_and_reset_at_each_cut():
    loop = Cut([admitted(0, [[0], [0]]), admitted(1, [[0], [0]])])
    loop.pacing.paced, loop.loop.steps = 3, 4
    stats = loop.cut(Engine(), seq=0, batch=0)[3]
    assert stats["paced_share"] == 0.75 and loop.pacing.paced == 0
