"""Answers over several turns with tools, above an engine written to slots (rollout.max_turns > 1
under either pacing; grpo.rollout.multi_turn does the same above an engine that samples whole
batches, with the same rules: grpo.rollout.multi_turn.Turns).

Each turn of an answer is one request to the engine below: the first on the prompt, every
later one on prompt + answer so far, admitted into the slot the turn before it freed as soon
as that turn ends and the tool has answered, so the answer goes on while the others decode.
The tools' closing tags are among the engine's stop strings (EngineContext.stop_strings), so a
turn that calls a tool ends with the call. Turn k of an answer is request uid * max_turns + k,
seeded with the answer's seed + k * TURN_SEED and capped by what is left of the budget.

The answer the sampler sees (an `Answer` of its own, the engine's turns appended to it) records
1 in `mask` on the tokens the model sampled and 0 on a tool's, whose log-probs are 0 and whose
version is that of the token before them. A resumed sampler's answers are put back as the
engine's request for their current turn, with that turn's tokens so far (`restore`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from grpo.rollout.multi_turn import TURN_SEED, Turns
from grpo.rollout.slots import Answer, SlotEngine, SlotRequest
from grpo.tools import Toolbox
from grpo.weights.version import Version

if TYPE_CHECKING:
    from grpo.config.sections import RolloutConfig


def with_tool_slots(engine: SlotEngine, cfg: RolloutConfig, tokenizer: Any) -> SlotEngine:
    """`engine` itself for single-turn answers (rollout.max_turns 1), else the multi-turn loop
    over its slots with the tools rollout.tools names."""
    if cfg.max_turns == 1:
        return engine
    turns = Turns(tokenizer, Toolbox.named(cfg.tools), cfg.max_turn_tokens)
    return ToolSlots(engine, turns, cfg.max_turns, tuple(cfg.stop))


class ToolSlots:
    """`engine`'s slots, each answer taking turns with the tools between them (see the module).
    Weights, caches and closing are the engine's."""

    def __init__(self, engine: SlotEngine, turns: Turns, max_turns: int, stop: tuple[str, ...]):
        self.engine = engine
        self.turns = turns
        self.max_turns = max_turns
        self.stop = stop  # the run's: a turn that ends at one ends the answer
        self.answers: dict[int, Answer] = {}  # by the engine's request uid of their turn

    @property
    def slots(self) -> int:
        return self.engine.slots

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def stop_event(self):
        return self.engine.stop_event

    def free_slots(self) -> list[int]:
        return self.engine.free_slots()

    def in_flight(self) -> list[Answer]:
        return sorted(self.answers.values(), key=lambda a: a.slot)

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        answers = [Answer(r, -1, mask=[], turns=0) for r in requests]
        self._start_turns(answers)
        return answers

    def step(self) -> list[Answer]:
        """One step below; each turn that ended is taken into its answer, which ends or, after
        the tool's result, starts its next turn. The answers that ended, in slot order."""
        finished = []
        going = []
        for turn in self.engine.step():
            answer = self.answers.pop(turn.request.uid)
            self._take_turn(answer, turn)
            (finished if answer.done else going).append(answer)
        if going:
            self._start_turns(going)
        return sorted(finished, key=lambda a: a.slot)

    def _take_turn(self, answer: Answer, turn: Answer) -> None:
        assert answer.mask is not None
        answer.tokens += turn.tokens
        answer.logps += turn.logps
        answer.versions += turn.versions
        answer.mask += [1] * len(turn.tokens)
        answer.turns += 1
        budget = answer.request.max_new_tokens
        last = answer.turns == self.max_turns
        ids = np.asarray(turn.tokens, np.int32)
        end = self.turns.after(
            ids, turn.finish_reason == "length", last, len(answer.tokens), self.stop, budget
        )
        if end.finish is not None:
            answer.finish_reason = end.finish
            return
        n = len(end.result_ids)
        answer.tokens += end.result_ids.tolist()
        answer.logps += [0.0] * n
        answer.versions += [answer.versions[-1] if answer.versions else self.version] * n
        answer.mask += [0] * n
        answer.tool_calls += 1
        answer.tool_errors += int(end.error)

    def _turn_request(self, answer: Answer, start: int) -> SlotRequest:
        """The engine's request for `answer`'s current turn, which begins at token `start`."""
        r, k = answer.request, answer.turns
        return SlotRequest(
            r.uid * self.max_turns + k,
            np.concatenate([r.prompt_ids, np.asarray(answer.tokens[:start], np.int32)]),
            (r.seed + k * TURN_SEED) % 2**62,
            self.turns.cap(start, r.max_new_tokens),
        )

    def _start_turns(self, answers: list[Answer]) -> None:
        turns = self.engine.admit([self._turn_request(a, len(a.tokens)) for a in answers])
        for answer, turn in zip(answers, turns, strict=True):
            answer.slot = turn.slot
            self.answers[turn.request.uid] = answer

    def restore(self, answers: list[Answer]) -> None:
        """A resumed sampler's answers in flight: each as its current turn's request with that
        turn's tokens so far, into its slot."""
        turns = []
        for answer in answers:
            assert answer.mask is not None, "a single-turn answer in a multi-turn run"
            start = len(answer.mask) - answer.mask[::-1].index(0) if 0 in answer.mask else 0
            request = self._turn_request(answer, start)
            turns.append(
                Answer(
                    request,
                    answer.slot,
                    answer.tokens[start:],
                    answer.logps[start:],
                    answer.versions[start:],
                )
            )
            self.answers[request.uid] = answer
        self.engine.restore(turns)

    def load(self, version: Version) -> Any:
        return self.engine.load(version)

    def rebuild_cache(self) -> None:
        self.engine.rebuild_cache()

    def close(self) -> None:
        self.engine.close()
