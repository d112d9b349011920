"""Lock-step pacing's own rules (grpo.sampler.pacing.LockStep), on a real generation loop with
a stand-in engine, shard and weights: DAPO's dynamic sampling draws each round with seeds of
its own, and past the round cap the batch takes the groups that teach before the flat ones."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from grpo.config import load_config
from grpo.rollout.slots import Answer
from grpo.sampler.episodes import Group
from grpo.sampler.generation import GenerationLoop
from grpo.sampler.pacing import LockStep
from grpo.tasks.encoding import Prompt
from tests.test_continuous_loop import Batches, Engine, admitted

Q, G = 2, 2
SETTINGS = [f"rollout.questions_per_step={Q}", f"rollout.group_size={G}",
            "rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=3"]  # fmt: skip


class Shard:
    position = 0

    def draw(self, n: int) -> list[Prompt]:
        self.position += n
        return [Prompt(self.position, {}, np.zeros(3, np.int32), position=self.position)]


class Slots(Engine):
    """Room for every round; records each request's seed."""

    version = 0

    def __init__(self) -> None:
        super().__init__()
        self.seeds: list[int] = []

    def free_slots(self) -> list[int]:
        return list(range(self.slots))

    def admit(self, requests) -> list[Answer]:
        self.seeds += [r.seed for r in requests]
        return [Answer(r, k) for k, r in enumerate(requests)]


def loop_of(pacing: LockStep) -> GenerationLoop:
    cfg = load_config(None, SETTINGS)
    weights = SimpleNamespace(version=0, serve=lambda needed: 0)
    loop = GenerationLoop(cfg, Shard(), Batches(), weights, pacing)  # type: ignore[arg-type]
    loop.seq = 4
    return loop


def test_each_round_of_dynamic_sampling_draws_with_seeds_of_its_own() -> None:
    """A second round samples new questions; with the first round's seeds its answers would be
    drawn from the same random numbers."""
    pacing = LockStep(load_config(None, SETTINGS))
    loop, engine = loop_of(pacing), Slots()
    run = SimpleNamespace(  # a RunView
        next_batch=lambda: (4, 1),
        groups_wanted=lambda: Q,
        wait_for_room=lambda: None,
        send=lambda batch: None,
        stopped=lambda: False,
    )
    rounds = []
    for _ in range(2):
        pacing.admit(loop, engine, run)  # type: ignore[arg-type]
        rounds.append(engine.seeds)
        engine.seeds = []
        for g in loop.groups:  # the round scored: the next one may start
            g.group = object()  # type: ignore[assignment]
    assert len(rounds[0]) == len(rounds[1]) == Q * G and pacing.rounds == 2
    assert not set(rounds[0]) & set(rounds[1]), rounds


def test_past_the_round_cap_the_groups_that_teach_come_before_the_flat_ones() -> None:
    pacing = LockStep(load_config(None, SETTINGS))
    loop = loop_of(pacing)
    flat = [admitted(0, [[0], [0]]), admitted(2, [[0], [0]])]  # every answer rewarded 0.0
    teaching = admitted(1, [[0], [0]])
    teaching.group = Group(teaching.prompt, [a.generation() for a in teaching.answers],
                           [(0.0, {}), (1.0, {})])  # fmt: skip
    loop.groups = [flat[0], teaching, flat[1]]
    pacing.rounds = 3  # the cap: no other round
    seq, questions, version, stats = pacing.cut(loop, Engine(), None)  # type: ignore[arg-type]
    assert questions == [1, 0]
    assert (stats["flat_groups_kept"], stats["flat_groups_dropped"]) == (1.0, 1.0)
