"""A scripted rollout engine that calls the calculator: no model, exact token ids.

Use it with `rollout.backend: tests.plugins.tool_engine:build`, `rollout.max_turns` >= 2 and
`rollout.tools: [calculator]`. It answers each prompt by its last text:
- a prompt that ends with a tool's result (a second turn): FINAL with the result's number, then
  EOS (finish_reason "stop");
- any other prompt (a first turn): answer j of its n is CALLS[j % 3], ended at the calculator's
  closing tag as a stop string ends an engine's turn (finish_reason "stop", no EOS), or for
  CALLS[2] (None) FINAL with 84 and EOS at once: no tool call.
Every answer is cut at max_new_tokens (finish_reason "length"). It reports a log-prob of -0.5
per token, as an engine that has them does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from grpo.config.engines import EngineAbilities
from grpo.rollout.base import EngineContext, Generation, Sampling
from grpo.rollout.slots import Answer, SlotRequest, SlotTable
from grpo.tools import RESULT_CLOSE, RESULT_OPEN
from grpo.weights.version import Version

CALLS = ("<calc>12*7</calc>", "<calc>12/0</calc>", None)  # 84, an error, no call
FINAL = "Twelve times seven is the total we want, so the answer is\n#### {}"  # worked: 11 words
LOGP = -0.5


def build(ctx: EngineContext) -> ToolEngine:
    return ToolEngine(ctx.tokenizer, ctx.stop_event)


class ToolEngine:
    def __init__(self, tokenizer, stop_event: threading.Event | None = None):
        self.tokenizer = tokenizer
        self.stop_event = stop_event or threading.Event()
        self.calls: list[dict] = []  # what each generate() was asked: for the tests

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def answer(self, prompt: np.ndarray, j: int) -> tuple[list[int], str]:
        """(token ids, finish reason) of answer j to `prompt`, before the cap."""
        text = self.tokenizer.decode(np.asarray(prompt).tolist(), skip_special_tokens=False)
        if text.endswith(RESULT_CLOSE):  # a second turn: answer with the result's number
            result = text[text.rfind(RESULT_OPEN) + len(RESULT_OPEN) : -len(RESULT_CLOSE)]
            value = result if not result.startswith("error") else "unknown"
            return [*self.ids(FINAL.format(value)), self.tokenizer.eos_token_id], "stop"
        call = CALLS[j % len(CALLS)]
        if call is None:
            return [*self.ids(FINAL.format(84)), self.tokenizer.eos_token_id], "stop"
        return self.ids(call), "stop"

    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        stop, cap = sampling.stop, sampling.max_new_tokens
        # A turn ends at the closing tag only because the loop asks for it as a stop string.
        assert "</calc>" in stop, f"the calculator's closing tag is not a stop string: {stop}"
        self.calls.append({"prompts": [np.asarray(p) for p in prompts], "n": sampling.n,
                           "max_new_tokens": cap})  # fmt: skip
        out = []
        for prompt in prompts:
            if self.stop_event.is_set():
                break
            for j in range(sampling.n):
                ids, reason = self.answer(prompt, j)
                if len(ids) > cap:
                    ids, reason = ids[:cap], "length"
                completion = np.asarray(ids, np.int32)
                logp = np.full(len(completion), LOGP, np.float32)
                out.append(Generation(np.asarray(prompt, np.int32), completion, reason, logp))
        return out

    def load(self, version: Version) -> None:
        """No weights."""

    def close(self) -> None:
        """Nothing held."""


def build_slots(ctx: EngineContext) -> ToolSlotEngine:
    """The same script written to slots: `rollout.backend: tests.plugins.tool_engine:build_slots`
    runs it under both pacings, its turns under the slots' multi-turn loop
    (grpo.rollout.tool_slots)."""
    r = ctx.cfg.rollout
    slots = r.slots or r.questions_per_step * r.group_size
    return ToolSlotEngine(ctx.tokenizer, slots, ctx.stop_strings, ctx.stop_event)


build_slots.abilities = EngineAbilities(reports_logprobs=True, continuous=True)  # type: ignore[attr-defined]


class ToolSlotEngine(ToolEngine, SlotTable):
    """Each step samples a whole turn of every answer in flight: answer j's script is chosen by
    its seed (j = seed % 3), so a group's answers differ as ToolEngine's n answers do."""

    def __init__(self, tokenizer, slots: int, stop: tuple[str, ...], stop_event=None):
        super().__init__(tokenizer, stop_event)
        # A turn ends at the closing tag only because the loop asks for it as a stop string.
        assert "</calc>" in stop, f"the calculator's closing tag is not a stop string: {stop}"
        SlotTable.__init__(self, slots)
        self.version = 0
        self.requests: list[SlotRequest] = []  # every turn admitted: for the tests

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        self.requests += requests
        return self.seat(requests)

    def step(self) -> list[Answer]:
        finished = self.in_flight()
        for a in finished:
            ids, reason = self.answer(a.request.prompt_ids, a.request.seed % len(CALLS))
            cap = a.request.max_new_tokens
            if len(ids) > cap:
                ids, reason = ids[:cap], "length"
            a.tokens += [int(t) for t in ids]
            a.logps += [LOGP] * len(ids)
            a.versions += [self.version] * len(ids)
            a.finish_reason = reason
            self.release(a.slot)
        return finished

    def load(self, version: Version) -> None:
        """No weights: the version alone."""
        self.version = version.number

    def rebuild_cache(self) -> None:
        """No cache."""

    def restore(self, answers: list[Answer]) -> None:
        self.reseat(answers)
