"""A toy rollout engine, defined outside grpo/ in one file: scripted answers, no model.

Use it with `rollout.backend: tests.plugins.toy_engine:build`. It implements
grpo.rollout.base.RolloutEngine: `n` answers per prompt, contiguous, of token ids drawn with a
seeded RNG from a small range of the tokenizer's ordinary tokens. About half end with EOS
(finish_reason "stop"); the others run to max_new_tokens ("length"). It reports log-probs, as
an engine that has them does: each token's log of the uniform probability over that range.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from grpo.rollout.base import EngineContext, Generation, Sampling
from grpo.weights.version import Version

RANGE = 64  # how many token ids the answers are drawn from


def build(ctx: EngineContext) -> ToyEngine:
    """The factory the config names: the toy needs only the tokenizer and the stop event."""
    return ToyEngine(ctx.tokenizer, ctx.stop_event)


class ToyEngine:
    def __init__(self, tokenizer, stop_event: threading.Event):
        self.stop_event = stop_event
        self.eos_id = int(tokenizer.eos_token_id)
        special = set(tokenizer.all_special_ids)
        middle = tokenizer.vocab_size // 2  # ordinary tokens, well below the vocabulary size
        ids = [i for i in range(middle, tokenizer.vocab_size) if i not in special]
        self.token_ids = np.asarray(ids[:RANGE], dtype=np.int32)
        self.token_logp = np.float32(-np.log(len(self.token_ids)))
        self.version = 0  # the last version load was given
        self.loaded: list[int] = []

    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        """Reads only n, max_new_tokens and seed: a scripted engine has no distribution for the
        rest to shape."""
        rng, cap = np.random.default_rng(sampling.seed), sampling.max_new_tokens
        out: list[Generation] = []
        for prompt in prompts:
            if self.stop_event.is_set():  # stop early with what there is
                break
            prompt_ids = np.asarray(prompt, dtype=np.int32)
            for _ in range(sampling.n):
                if rng.random() < 0.5:  # ends with EOS somewhere within the cap
                    length = int(rng.integers(1, cap + 1))
                    drawn = rng.choice(self.token_ids, size=length - 1)
                    ids = np.append(drawn, self.eos_id).astype(np.int32)
                    reason = "stop"
                else:  # cut at the cap
                    ids = rng.choice(self.token_ids, size=cap).astype(np.int32)
                    reason = "length"
                logp = np.full(len(ids), self.token_logp, dtype=np.float32)
                out.append(Generation(prompt_ids, ids, reason, logp))
        return out

    def load(self, version: Version) -> None:
        """No weights to load: remember which version the sampler asked for."""
        self.version = version.number
        self.loaded.append(version.number)

    def close(self) -> None:
        """Nothing held."""
