"""The rollout engine as the sampler drives it: a fixed number of slots, each decoding one
answer; whole groups are admitted into free slots, `step()` decodes until answers finish, and
a new version is loaded between two steps.

This is the one interface the sampler's loop (grpo.sampler.generation) sees, under both
pacings (rollout.mode): lock-step admits a batch's groups into an empty engine and steps until
they all finish, loading versions only between batches; continuous refills slots as answers
finish and loads versions under the answers in flight (the engine keeps or recomputes the cache
of the tokens already generated: rollout.kv_on_update).

An engine that samples whole batches with one call (grpo.rollout.base.RolloutEngine:
`generate`) is seen through these slots by grpo.rollout.generate_slots, which finishes every
admitted answer in one step: lock-step only. An engine written to these slots runs both.

Every generated token records the weights version that sampled it and its log-prob under them
(the behaviour policy of that token), where the engine knows them.

Exact resume (continuous, HF): at every batch cut the sampler calls `rebuild_cache()` and saves
the answers in flight; a resumed sampler `restore()`s them into the same slots, which rebuilds
the cache by the same computation, so decoding goes on bit for bit as in the uninterrupted run.
Sampling draws token t of an answer from an RNG seeded by (the answer's seed, t), never from a
shared stream, so it needs no RNG state saved.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from grpo.rollout.base import Generation

if TYPE_CHECKING:
    from grpo.weights.version import Version


@dataclass(frozen=True)
class SlotRequest:
    """One answer to generate."""

    uid: int  # unique in the run and deterministic: the sampler's admission counter
    prompt_ids: np.ndarray  # int32 (P,)
    # Token t is sampled with an RNG seeded by (seed, t); an engine that samples a group in one
    # call seeds the call with it (lock-step gives a round's answers the round's seed).
    seed: int
    max_new_tokens: int


@dataclass
class Answer:
    """A request's progress, appended to by the engine at each decode step."""

    request: SlotRequest
    slot: int  # the engine's slot (row) it decodes in; restore() puts it back there
    tokens: list[int] = field(default_factory=list)
    # The log-prob of each token under the weights that sampled it, at the sampling
    # temperature and truncation (the distribution it was drawn from).
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weights version of each token
    finish_reason: str | None = None  # None while in flight; then "stop" | "length"
    # A multi-turn answer's (grpo.rollout.tool_slots): 1 on the tokens the model sampled, 0 on
    # a tool's results; None: a single-turn answer, every token the model's.
    mask: list[int] | None = None
    turns: int = 1
    tool_calls: int = 0
    tool_errors: int = 0
    # The answer as an engine that returns whole answers made it (grpo.rollout.generate_slots),
    # with what the lists above do not hold (a multi-turn answer's loss mask and turns).
    whole: Generation | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def generation(self) -> Generation:
        """The finished answer as the batch code takes it."""
        assert self.finish_reason is not None, "an answer in flight is not a generation"
        if self.whole is not None:
            return self.whole
        return Generation(
            np.asarray(self.request.prompt_ids, np.int32),
            np.asarray(self.tokens, np.int32),
            self.finish_reason,
            rollout_logp=np.asarray(self.logps, np.float32),
            loss_mask=None if self.mask is None else np.asarray(self.mask, np.uint8),
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            token_versions=np.asarray(self.versions, np.int32),
        )

    def to_state(self) -> dict[str, Any]:
        """JSON-able, for the sampler's resume state (floats round-trip exactly)."""
        r = self.request
        return {
            "uid": r.uid,
            "prompt_ids": [int(t) for t in r.prompt_ids],
            "seed": r.seed,
            "max_new_tokens": r.max_new_tokens,
            "slot": self.slot,
            "tokens": list(self.tokens),  # copies: the engine goes on appending to these
            "logps": list(self.logps),
            "versions": list(self.versions),
            "finish_reason": self.finish_reason,
            "mask": None if self.mask is None else list(self.mask),
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> Answer:
        request = SlotRequest(
            int(s["uid"]),
            np.asarray(s["prompt_ids"], np.int32),
            int(s["seed"]),
            int(s["max_new_tokens"]),
        )
        return cls(
            request,
            int(s["slot"]),
            [int(t) for t in s["tokens"]],
            [float(x) for x in s["logps"]],
            [int(v) for v in s["versions"]],
            s["finish_reason"],
            None if s.get("mask") is None else [int(m) for m in s["mask"]],
            int(s.get("turns", 1)),
            int(s.get("tool_calls", 0)),
            int(s.get("tool_errors", 0)),
        )


class SlotEngine(Protocol):
    """A fixed number of slots, each decoding one answer; the sampler drives it step by step.
    What it can do (continuous pacing, log-probs, ...) its factory declares
    (grpo.config.engines.EngineAbilities), so that the config's checks know it before a run.

    Sampling options (temperature, top_p, top_k, stop strings) are the run's, fixed when the
    engine is built; each request brings its own seed and cap."""

    stop_event: threading.Event  # set when the run is stopping
    slots: int
    version: int  # the weights version the next step samples with

    def free_slots(self) -> list[int]:
        """Slots with no answer in them, lowest first."""
        ...

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        """Start these answers in the lowest free slots (there must be enough); their prompts
        are prefilled by the next step. Returns their Answer records."""
        ...

    def step(self) -> list[Answer]:
        """Prefill what was admitted, then one decode step for every answer in flight; the
        answers that finished in it (their slots are free again), in slot order."""
        ...

    def in_flight(self) -> list[Answer]:
        """The answers in the slots, in slot order."""
        ...

    def load(self, version: Version) -> Any:
        """Serve `version` from the next step on, all or nothing (the RolloutEngine's load,
        grpo.rollout.base; an engine on the sampler's HF policy has nothing to load, the
        sampler loaded the policy first). The one call by which an engine learns a version:
        it becomes `self.version`, which tokens from the next step on record, and with
        rollout.kv_on_update: recompute the cache of the answers in flight is rebuilt under
        the new weights first."""
        ...

    def rebuild_cache(self) -> None:
        """Recompute the cache of every answer in flight from its tokens, under the current
        weights (what restore() does): a resume from here decodes bit for bit the same."""
        ...

    def restore(self, answers: list[Answer]) -> None:
        """Put saved answers in flight back into their slots (a resumed sampler) and rebuild
        the cache; the engine must be empty."""
        ...

    def close(self) -> None: ...


class SlotTable:
    """Which answer decodes in which slot: the bookkeeping every engine written to slots keeps,
    as a base class (free slots lowest first, `in_flight` in slot order); the engine seats
    what it admits or restores and releases what finishes."""

    def __init__(self, slots: int):
        self.slots = slots
        self.answers: list[Answer | None] = [None] * slots

    def free_slots(self) -> list[int]:
        return [s for s, a in enumerate(self.answers) if a is None]

    def in_flight(self) -> list[Answer]:
        return [a for a in self.answers if a is not None]

    def seat(self, requests: list[SlotRequest]) -> list[Answer]:
        """New answers for these requests in the lowest free slots (ValueError when fewer are
        free)."""
        free = self.free_slots()
        if len(requests) > len(free):
            raise ValueError(f"{len(requests)} answers admitted, {len(free)} slots free")
        answers = [Answer(r, s) for r, s in zip(requests, free, strict=False)]
        for a in answers:
            self.answers[a.slot] = a
        return answers

    def reseat(self, answers: list[Answer]) -> None:
        """Saved answers back into their own slots (a resumed sampler's); the table must be
        empty."""
        if self.in_flight():
            raise ValueError("restore() needs an engine with no answers in flight")
        for a in answers:
            if not 0 <= a.slot < self.slots or self.answers[a.slot] is not None:
                raise ValueError(f"cannot restore an answer into slot {a.slot}")
            self.answers[a.slot] = a

    def release(self, slot: int) -> None:
        self.answers[slot] = None
