"""The GPU speed options give the same numbers as the defaults (checked on CPU; their speed is
measured by `python -m bench.gpu` on a GPU): a static KV cache for HF generate, and packed
sequences with PyTorch's flex attention."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from grpo.models.loading import load_causal_lm, load_tokenizer
from grpo.rollout.base import Sampling
from grpo.rollout.hf import HFRollout
from grpo.scoring.forward import pairs_logprobs

RNG = np.random.default_rng(0)
PROMPTS = [RNG.integers(5, 1000, n).astype(np.int32) for n in (5, 9, 3)]
SAMPLING = Sampling(n=2, max_new_tokens=10, batch_size=4)


@pytest.mark.slow
def test_static_kv_cache_samples_the_same_tokens(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir).eval(), load_tokenizer(tiny_model_dir)
    out = {}
    for cache in ("dynamic", "static"):
        rollout = HFRollout(model, tok, cache=cache)
        greedy = rollout.generate(PROMPTS, replace(SAMPLING, greedy=True))
        sampled = rollout.generate(PROMPTS, replace(SAMPLING, seed=3))
        out[cache] = [g.completion_ids.tolist() for g in greedy + sampled]
    assert out["static"] == out["dynamic"] and len(out["static"]) == 12


@pytest.mark.extended  # CI leaves it out; packed forwards: test_logprobs.py
@pytest.mark.slow
def test_packed_flex_attention_matches_padded_sdpa(tiny_model_dir):
    """Flex attention keeps packed sequences apart with a document mask (no square mask over
    the row, which is why train.packing=auto packs with it). PyTorch has no CPU backward for
    it, so on CPU this checks the forward: the sampler's and the trainer's scoring pass."""
    completions = [RNG.integers(5, 1000, n).astype(np.int32) for n in (4, 7, 2)]
    with torch.no_grad():
        padded = pairs_logprobs(load_causal_lm(tiny_model_dir, "float32", "sdpa"), PROMPTS,
                                completions, packed=False, pad_id=0)  # fmt: skip
        flex = pairs_logprobs(load_causal_lm(tiny_model_dir, "float32", "flex_attention"),
                              PROMPTS, completions, packed=True, pad_id=0)  # fmt: skip
    diff = ((padded.logp - flex.logp) * padded.mask).abs().max()
    assert float(diff) < 1e-5, float(diff)
