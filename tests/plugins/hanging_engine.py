"""The HF rollout engine, except that one generate call never returns: a stand-in for a hung
engine step or a wedged GPU, which no stop flag reaches.

`rollout.backend: tests.plugins.hanging_engine:build`; the environment variable
GRPO_TEST_HANG_AT=k makes the k-th call (from 0) hang (unset: never).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from grpo.rollout import hf
from grpo.rollout.base import EngineContext, Generation, Sampling

HANG_AT = "GRPO_TEST_HANG_AT"


def build(ctx: EngineContext) -> HangingEngine:
    cache = ctx.cfg.rollout.hf_cache
    return HangingEngine(hf.HFRollout(ctx.policy(), ctx.tokenizer, ctx.stop_event, cache=cache))


class HangingEngine:
    def __init__(self, inner: hf.HFRollout):
        self.inner = inner
        self.stop_event = inner.stop_event
        self.calls = 0
        self.hang_at = int(os.environ.get(HANG_AT, "-1"))

    def generate(self, prompts: Any, sampling: Sampling) -> list[Generation]:
        call, self.calls = self.calls, self.calls + 1
        if call == self.hang_at:
            threading.Event().wait()  # forever, deaf to stop_event
        return self.inner.generate(prompts, sampling)

    def load(self, version: Any) -> None:
        self.inner.load(version)

    def close(self) -> None:
        self.inner.close()
