"""A toy rollout engine, defined outside grpo/ in one file: scripted answers, no model.

Use it with `rollout.backend: tests.plugins.toy_engine:build`. It is written to the sampler's
slot interface (grpo.rollout.slots.SlotEngine), so it runs both pacings, lock-step and
continuous, and its factory declares so (`build.abilities`). Each step appends one token to
every answer in flight, drawn from a small range of the tokenizer's ordinary tokens by an RNG
seeded by (the answer's seed, the token's position): which answers share a step never changes
an answer. About half end with EOS (finish_reason "stop"); the others run to their cap
("length"). It reports log-probs, as an engine that has them does: each token's log of the
uniform probability over that range.
"""

from __future__ import annotations

import threading

import numpy as np

from grpo.config.engines import EngineAbilities
from grpo.rollout.base import EngineContext
from grpo.rollout.slots import Answer, SlotRequest, SlotTable
from grpo.weights.version import Version

RANGE = 64  # how many token ids the answers are drawn from


def build(ctx: EngineContext) -> ToyEngine:
    """The factory the config names: the toy needs only the tokenizer, the slots and the stop
    event."""
    r = ctx.cfg.rollout
    return ToyEngine(ctx.tokenizer, r.slots or r.questions_per_step * r.group_size, ctx.stop_event)


build.abilities = EngineAbilities(reports_logprobs=True, continuous=True)  # type: ignore[attr-defined]


class ToyEngine(SlotTable):
    """Free slots, the answers in flight, and seating them: SlotTable's."""

    def __init__(self, tokenizer, slots: int, stop_event: threading.Event):
        super().__init__(slots)
        self.stop_event = stop_event
        self.version = 0  # the weights version the next step samples with
        self.eos_id = int(tokenizer.eos_token_id)
        special = set(tokenizer.all_special_ids)
        middle = tokenizer.vocab_size // 2  # ordinary tokens, well below the vocabulary size
        ids = [i for i in range(middle, tokenizer.vocab_size) if i not in special]
        self.token_ids = np.asarray(ids[:RANGE], dtype=np.int32)
        self.token_logp = float(-np.log(len(self.token_ids)))
        self.loaded: list[int] = []  # the versions load() was given
        self.changed_under: list[int] = []  # answers in flight at each version change

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        return self.seat(requests)

    def step(self) -> list[Answer]:
        finished = []
        for a in self.in_flight():
            if self.stop_event.is_set():
                break
            t = len(a.tokens)
            ends, length = self.plan(a.request)
            if ends and t == length - 1:
                token = self.eos_id
            else:
                token = int(np.random.default_rng((a.request.seed, t)).choice(self.token_ids))
            a.tokens.append(token)
            a.logps.append(self.token_logp)
            a.versions.append(self.version)
            if t + 1 == length:
                a.finish_reason = "stop" if ends else "length"
                self.release(a.slot)
                finished.append(a)
        return finished

    @staticmethod
    def plan(request: SlotRequest) -> tuple[bool, int]:
        """Whether the answer ends with EOS, and its length: seeded by the answer alone."""
        rng = np.random.default_rng((request.seed, 1 << 30))
        cap = request.max_new_tokens
        if rng.random() < 0.5:
            return True, int(rng.integers(1, cap + 1))
        return False, cap

    def load(self, version: Version) -> None:
        """No weights to load: remember which version the sampler asked for."""
        self.loaded.append(version.number)
        self.version = version.number
        self.changed_under.append(len(self.in_flight()))

    def rebuild_cache(self) -> None:
        """No cache: an answer's next token depends on its seed and position only."""

    def restore(self, answers: list[Answer]) -> None:
        self.reseat(answers)

    def close(self) -> None:
        """Nothing held."""
