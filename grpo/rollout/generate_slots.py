"""An engine that samples whole batches with one call (grpo.rollout.base.RolloutEngine:
`generate`, as HF's generate() and vLLM's LLM.generate do) seen through the slot interface
the sampler drives (grpo.rollout.slots.SlotEngine).

Admitted answers wait; the next `step()` samples them all with one generate() call and returns
them finished, so nothing is ever in flight across a step: it runs lock-step pacing only (the
config refuses rollout.mode: continuous for an engine whose factory does not declare it).
Each answer keeps the Generation the engine made (`Answer.whole`), so a batch's columns are
exactly what the engine returned (a multi-turn answer's loss mask and turns included).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from grpo.rollout.base import RolloutEngine, Sampling
from grpo.rollout.slots import Answer, SlotRequest, SlotTable
from grpo.weights.version import Version


class GenerateSlots(SlotTable):
    """`engine` behind slots: admitted groups are sampled together by the next step, with the
    seed and cap of their first request (lock-step gives a round's requests the same)."""

    def __init__(self, engine: RolloutEngine, sampling: Sampling, slots: int):
        super().__init__(slots)
        self.engine = engine
        self.sampling = sampling  # the run's; n is the group size
        self.stop_event = engine.stop_event
        self.version = 0

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        if len(requests) % self.sampling.n:
            raise ValueError(f"admit whole groups of {self.sampling.n}: got {len(requests)}")
        return self.seat(requests)

    def step(self) -> list[Answer]:
        """Every waiting answer, sampled by one generate() call; none if it was stopped (its
        output is partial then) or nothing waits. Every slot is free again after it."""
        waiting = self.in_flight()  # in admission order: all slots are free after a step
        if not waiting:
            return []
        first = waiting[0].request
        prompts = [a.request.prompt_ids for a in waiting[:: self.sampling.n]]
        sampling = replace(self.sampling, seed=first.seed, max_new_tokens=first.max_new_tokens)
        gens = self.engine.generate(prompts, sampling)
        if self.stop_event.is_set():
            return []
        for answer, gen in zip(waiting, gens, strict=True):
            answer.tokens = gen.completion_ids.tolist()
            answer.finish_reason = gen.finish_reason
            answer.whole = gen
            self.release(answer.slot)
        return waiting

    def load(self, version: Version) -> Any:
        how = self.engine.load(version)
        self.version = version.number
        return how

    def rebuild_cache(self) -> None:
        """No cache outlives a step."""

    def restore(self, answers: list[Answer]) -> None:
        raise ValueError("an engine that samples whole batches has no answers in flight to restore")

    def close(self) -> None:
        self.engine.close()
