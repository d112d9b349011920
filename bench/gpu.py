"""GPU variant: `python -m bench.gpu` on a machine with CUDA. Randomly initialised models of
real shapes (no download), bf16:

- generation: HF generate of 128 sequences x 256 new tokens with the embedded model's shape
  (SmolLM2-135M), the dynamic KV cache (rollout.hf_cache: dynamic, the default) against the
  static one (hf_cache: static, which transformers compiles on GPU); target 3x.
- training: forward + backward of the log-probs plus an AdamW step for the Qwen2.5-0.5B shape,
  padded micro-batches with sdpa against packed ones with flex attention (document masks, no
  extra package; flash_attention_2 too when flash-attn is installed); the row is ours' model
  FLOPs utilisation (6 x parameters x tokens per second / the card's measured bf16 matmul
  rate), target 0.3.

`--cpu-smoke` runs the same code with tiny shapes on CPU, to keep it working where no GPU is
(flex attention has no CPU backward, so the smoke run packs with sdpa).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.common import Result, machine, report
from grpo.rollout.base import Sampling
from grpo.rollout.hf import HFRollout
from grpo.scoring.forward import pairs_logprobs

QWEN_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4_864,
                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                max_position_embeddings=4_096, tie_word_embeddings=True)  # fmt: skip
SMOLLM2_135M = dict(vocab_size=49_152, hidden_size=576, intermediate_size=1_536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8_192, tie_word_embeddings=True)  # fmt: skip
TINY = dict(vocab_size=1_000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            tie_word_embeddings=True)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Seconds per call after one warm-up call (which also pays any compilation)."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / reps


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / _timed(lambda: a @ b, device, reps=20)


def _model(shape: dict, dtype: torch.dtype, device: torch.device, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config = (Qwen2Config if shape is QWEN_05B else LlamaConfig)(**shape)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn).to(
        device
    )


class _NoTokenizer:
    """HFRollout reads only the pad and EOS ids here (no stop strings)."""

    pad_token_id = 0
    eos_token_id = None


def generation_rates(smoke: bool, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Tokens/s of HFRollout.generate (the sampler's own code) per rollout.hf_cache setting.

    Every answer runs to max_new_tokens (no EOS id), so both settings do the same work."""
    model = _model(TINY if smoke else SMOLLM2_135M, dtype, device).eval()
    model.generation_config.eos_token_id = None
    n_seqs, prompt_len, new = (8, 16, 8) if smoke else (128, 128, 256)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 1000, prompt_len).astype(np.int32) for _ in range(n_seqs)]
    sampling = Sampling(max_new_tokens=new, batch_size=n_seqs)
    rates = {}
    for cache in ("dynamic", "static"):
        rollout = HFRollout(model, _NoTokenizer(), cache=cache)
        seconds = _timed(
            lambda r=rollout: r.generate(prompts, sampling),
            device,
            reps=1 if smoke else 2,
        )
        rates[cache] = n_seqs * new / seconds
    return rates


def trainer_rates(
    smoke: bool, device: torch.device, dtype: torch.dtype
) -> tuple[dict[str, float], int]:
    """Trainer tokens/s (log-prob forward + backward + AdamW) per attention layout, and the
    model's parameter count."""
    shape = TINY if smoke else QWEN_05B
    layouts = {"padded sdpa": ("sdpa", False)}
    if smoke:
        layouts["packed sdpa"] = ("sdpa", True)
    else:
        layouts["packed flex_attention"] = ("flex_attention", True)
        if importlib.util.find_spec("flash_attn") is not None:
            layouts["packed flash_attention_2"] = ("flash_attention_2", True)
    rng = np.random.default_rng(0)
    n_seqs, vocab = (4, shape["vocab_size"]) if smoke else (16, shape["vocab_size"])
    # answer lengths vary as in a real batch, so padding has something to waste
    p_lens = rng.integers(8, 16, n_seqs) if smoke else rng.integers(64, 192, n_seqs)
    c_lens = rng.integers(4, 16, n_seqs) if smoke else rng.integers(32, 512, n_seqs)
    prompts = [rng.integers(0, vocab, n) for n in p_lens]
    completions = [rng.integers(0, vocab, n) for n in c_lens]
    tokens = int(p_lens.sum() + c_lens.sum())
    rates, params = {}, 0
    for name, (attn, packed) in layouts.items():
        model = _model(shape, dtype, device, attn).train()
        params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step(m=model, o=opt, packed=packed) -> None:
            out = pairs_logprobs(m, prompts, completions, packed=packed, pad_id=0)
            (out.logp * out.mask).sum().backward()
            o.step()
            o.zero_grad(set_to_none=True)

        rates[name] = tokens / _timed(step, device, reps=3)
        del model, opt
    return rates, params


def run(smoke: bool = False) -> list[Result]:
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    m = machine() + (f", {torch.cuda.get_device_name()}" if device.type == "cuda" else "")
    prefix = "gpu_smoke" if smoke else "gpu"

    gen = generation_rates(smoke, device, dtype)
    gen_note = ", ".join(f"{k} cache {v:,.0f} tokens/s" for k, v in gen.items())
    results = [report(Result.of(f"{prefix}_hf_generate_static_vs_dynamic_cache", "tokens/s",
                                [gen["dynamic"]], [gen["static"]], "ours/baseline", 3.0, m,
                                "HF generate with a static KV cache; baseline: the default "
                                "dynamic cache, what a user gets without asking; one "
                                "measurement each", gen_note, smoke))]  # fmt: skip

    peak = matmul_flops(device, dtype, 256 if smoke else 8192)
    rates, params = trainer_rates(smoke, device, dtype)
    best = max(rates, key=rates.get)
    mfu = {k: 6 * params * v / peak for k, v in rates.items()}
    note = (
        f"{params / 1e6:.0f} M parameters, {dtype}; matmul {peak / 1e12:.1f} TFLOP/s; "
        + "; ".join(f"{k} {v:,.0f} tokens/s (MFU {mfu[k]:.2f})" for k, v in rates.items())
    )
    # baseline = the card's measured matmul rate; ours = the best layout's model FLOPs rate
    results.append(
        report(
            Result.of(
                f"{prefix}_trainer_mfu",
                "FLOP/s",
                [peak],
                [6 * params * rates[best]],
                "ours/baseline",  # the ratio is the MFU
                0.3,
                m,
                "trainer forward + backward + AdamW step in each attention layout, the best "
                "one's model FLOPs rate; baseline: the card's measured matmul rate (a ceiling, "
                "not an alternative); one measurement",
                f"best: {best}; {note}",
                smoke,
            )
        )
    )
    return results


if __name__ == "__main__":
    smoke = "--cpu-smoke" in sys.argv
    if not smoke and not torch.cuda.is_available():
        sys.exit("bench.gpu: no CUDA device here; `--cpu-smoke` runs its code on CPU")
    run(smoke)
