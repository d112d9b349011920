"""Answers over several turns with tools, above any rollout engine (rollout.max_turns > 1).

Each turn is one `engine.generate` on token ids: the first on the prompts, n answers each; every
later one on prompt + answer so far, one answer each, for the answers still going. The tools'
closing tags are stop strings, so a turn that calls a tool ends with the call (the engines keep
the tokens that complete a stop string). The tool's result is tokenised once and appended: an
answer's ids are exactly the tokens the model read and sampled, never decoded and re-encoded.
`Generation.loss_mask` is 1 on the tokens the model sampled and 0 on a tool's; the engine's
log-probs, when it reports them, are 0 on a tool's tokens.

Budget: max_new_tokens bounds the whole answer (every turn and tool result), so the answer fits
where a single-turn one did (vLLM's max_model_len, Dr. GRPO's constant); a turn samples at most
rollout.max_turn_tokens (0: what is left of it). An answer ends with finish_reason "stop" when a
turn ends without a tool call (EOS or a rollout.stop string), and with "length" when a turn is
cut by its budget, when it calls a tool after the last turn, or when the tool's result would
leave no room for another turn.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from grpo.rollout.base import Generation, RolloutEngine, Sampling
from grpo.tools import Toolbox
from grpo.weights.version import Version

if TYPE_CHECKING:
    from grpo.config.sections import RolloutConfig

# Turn t samples with seed + t * TURN_SEED, far from the seeds of other batches (seed + k).
TURN_SEED = 9_999_991


def with_tools(engine: RolloutEngine, cfg: RolloutConfig, tokenizer: Any) -> RolloutEngine:
    """`engine` itself for single-turn answers (rollout.max_turns 1: nothing changes), else the
    multi-turn loop over it with the tools rollout.tools names."""
    if cfg.max_turns == 1:
        return engine
    toolbox = Toolbox.named(cfg.tools)
    return MultiTurnEngine(engine, tokenizer, toolbox, cfg.max_turns, cfg.max_turn_tokens)


def tool_info(gen: Generation) -> dict[str, int]:
    """What a multi-turn answer adds to its reward info (and so to the metrics); nothing for a
    single-turn one, whose batches stay as they were."""
    if gen.loss_mask is None:
        return {}
    return {"turns": gen.turns, "tool_calls": gen.tool_calls, "tool_errors": gen.tool_errors}


@dataclass(frozen=True)
class TurnEnd:
    """How a turn ends: the answer with `finish`, or a tool's result to append (`result_ids`,
    `error` when the tool failed) and another turn."""

    finish: str | None
    result_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    error: bool = False


@dataclass(frozen=True)
class Turns:
    """The rules of a multi-turn answer (see the module), the same whether an engine samples a
    turn of every answer with one call (MultiTurnEngine) or answers in slots
    (grpo.rollout.tool_slots)."""

    tokenizer: Any
    toolbox: Toolbox
    max_turn_tokens: int = 0  # 0: what is left of the budget

    def cap(self, length: int, budget: int) -> int:
        """The next turn's cap, the answer holding `length` tokens of `budget` (>= 1: a tool's
        result is appended only with room after it)."""
        left = budget - length
        return min(self.max_turn_tokens or left, left)

    def after(
        self,
        ids: np.ndarray,
        cut: bool,
        last: bool,
        length: int,
        stop: Sequence[str],
        budget: int,
    ) -> TurnEnd:
        """A turn's end: `ids` its tokens, `cut` when its cap or the engine's ended it, `last`
        when it was the last turn allowed, `length` the answer's tokens with it."""
        if cut:
            return TurnEnd("length")
        # special tokens kept, as HF's stop-string search decodes them (grpo.rollout.hf)
        text = self.tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=False)
        call = self.toolbox.find_call(text, stop)
        if call is None:  # EOS or a rollout.stop string: the answer is complete
            return TurnEnd("stop")
        if last:  # no turn left to read the result
            return TurnEnd("length")
        result = self.toolbox.run(call)
        result_ids = self.tokenizer(result.text, add_special_tokens=False).input_ids
        if length + len(result_ids) >= budget:
            return TurnEnd("length")
        return TurnEnd(None, np.asarray(result_ids, np.int32), result.error)


@dataclass
class _Answer:
    """One answer being built, turn by turn."""

    prompt: np.ndarray  # int32
    parts: list[np.ndarray] = field(default_factory=list)  # int32 turns and tool results
    masks: list[np.ndarray] = field(default_factory=list)  # uint8, 1 = the model's
    logps: list[np.ndarray | None] = field(default_factory=list)  # the engine's, 0 on a tool's
    finish_reason: str | None = None  # set when the answer is done
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0

    @property
    def length(self) -> int:
        return sum(len(p) for p in self.parts)

    def context(self) -> np.ndarray:
        """What the next turn reads: the prompt and the answer so far, as ids."""
        return np.concatenate([self.prompt, *self.parts])

    def add(self, ids: np.ndarray, by_model: bool, logp: np.ndarray | None) -> None:
        self.parts.append(np.asarray(ids, np.int32))
        self.masks.append(np.full(len(ids), int(by_model), np.uint8))
        self.logps.append(logp if by_model else np.zeros(len(ids), np.float32))

    def generation(self) -> Generation:
        assert self.finish_reason is not None
        logps = self.logps
        rollout = (
            None if any(lp is None for lp in logps) else np.concatenate(logps).astype(np.float32)
        )
        return Generation(
            self.prompt,
            np.concatenate(self.parts, dtype=np.int32),
            self.finish_reason,
            rollout,
            loss_mask=np.concatenate(self.masks, dtype=np.uint8),
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
        )


class MultiTurnEngine:
    """A RolloutEngine whose answers may call tools between turns; the engine under it samples
    every turn. Weights and closing are the engine's."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        toolbox: Toolbox,
        max_turns: int,
        max_turn_tokens: int = 0,
    ):
        if max_turns < 1 or max_turn_tokens < 0:
            raise ValueError(
                f"need max_turns >= 1 and max_turn_tokens >= 0, got {max_turns}, {max_turn_tokens}"
            )
        self.engine = engine
        self.toolbox = toolbox
        self.max_turns = max_turns
        self.turns = Turns(tokenizer, toolbox, max_turn_tokens)

    @property
    def stop_event(self) -> threading.Event:
        return self.engine.stop_event

    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        """`sampling.n` answers per prompt, contiguous, each over up to max_turns turns (see the
        module docstring for the budget). Returns [] once the stop event is set: a half-built
        batch is never used (the sampler checks the event)."""
        stop, budget = sampling.stop, sampling.max_new_tokens
        stops = (*stop, *self.toolbox.stop_strings)
        answers = [_Answer(np.asarray(p, np.int32)) for p in prompts for _ in range(sampling.n)]
        active, contexts, copies = answers, list(prompts), sampling.n
        for turn in range(self.max_turns):
            caps = [self.turns.cap(a.length, budget) for a in active]
            # One call for every answer still going, with the largest cap among them: each is
            # then cut to its own. A cut keeps the distribution (sampling a prefix does not
            # depend on the cap) and saves a call per distinct cap.
            turn_sampling = replace(
                sampling,
                n=copies,
                max_new_tokens=max(caps),
                stop=stops,
                seed=sampling.seed + turn * TURN_SEED,
            )
            gens = self.engine.generate(contexts, turn_sampling)
            if self.stop_event.is_set():
                return []
            last = turn == self.max_turns - 1
            for answer, gen, cap in zip(active, gens, caps, strict=True):
                self._take_turn(answer, gen, cap, stop, budget, last)
            active = [a for a in answers if a.finish_reason is None]
            if not active:
                break
            contexts, copies = [a.context() for a in active], 1
        return [a.generation() for a in answers]

    def _take_turn(
        self,
        answer: _Answer,
        gen: Generation,
        cap: int,
        stop: Sequence[str],
        budget: int,
        last: bool,
    ) -> None:
        """Add one turn's tokens to `answer`, then end it or append the tool's result."""
        ids = gen.completion_ids[:cap]
        logp = None if gen.rollout_logp is None else gen.rollout_logp[:cap]
        answer.add(ids, True, logp)
        answer.turns += 1
        cut = len(ids) < len(gen.completion_ids) or gen.finish_reason == "length"
        end = self.turns.after(ids, cut, last, answer.length, stop, budget)
        if end.finish is not None:
            answer.finish_reason = end.finish
            return
        answer.add(end.result_ids, False, None)
        answer.tool_calls += 1
        answer.tool_errors += int(end.error)

    def load(self, version: Version) -> Any:
        return self.engine.load(version)

    def close(self) -> None:
        self.engine.close()
