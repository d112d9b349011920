"""GPU variant: `python -m bench.gpu` on a machine with CUDA.

A randomly initialised model of the Qwen2.5-0.5B shape (no download), in bf16:
- the card's measured bf16 matrix-multiply rate (8192^3 matmuls), the peak for MFU;
- HF generate tokens/s (64 prompts x 256 new tokens);
- trainer tokens/s: packed forward + backward of the log-probs plus an AdamW step, and its
  model FLOPs utilisation (6 x parameters x tokens per second / the matmul rate).
`--cpu-smoke` runs the same code with a tiny config on CPU, to keep it working where no GPU is.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from bench.common import Result, machine, report
from grpo.logprobs import pairs_logprobs

QWEN_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4_864,
                num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                max_position_embeddings=4_096, tie_word_embeddings=True)  # fmt: skip
TINY = dict(vocab_size=1_000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            tie_word_embeddings=True)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a, b = (
        torch.randn(n, n, device=device, dtype=dtype),
        torch.randn(n, n, device=device, dtype=dtype),
    )
    for _ in range(3):
        a @ b
    _sync(device)
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def run(smoke: bool = False) -> list[Result]:
    from transformers import AutoModelForCausalLM, Qwen2Config

    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    shape = TINY if smoke else QWEN_05B
    model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=dtype).to(device)
    params = sum(p.numel() for p in model.parameters())
    peak = matmul_flops(device, dtype, 256 if smoke else 8192)
    m = machine() + (f", {torch.cuda.get_device_name()}" if device.type == "cuda" else "")

    # generation
    n_prompts, prompt_len, new = (4, 16, 8) if smoke else (64, 128, 256)
    ids = torch.randint(0, shape["vocab_size"], (n_prompts, prompt_len), device=device)
    model.eval()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=True, min_new_tokens=4)  # warm-up
        _sync(device)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=True)
        _sync(device)
    gen_rate = n_prompts * new / (time.perf_counter() - t0)

    # training: packed log-prob forward/backward and an optimizer step
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rng = np.random.default_rng(0)
    n_seqs, p_len, c_len = (4, 16, 16) if smoke else (16, 128, 384)
    prompts = [rng.integers(0, shape["vocab_size"], p_len) for _ in range(n_seqs)]
    completions = [rng.integers(0, shape["vocab_size"], c_len) for _ in range(n_seqs)]

    def step() -> None:
        out = pairs_logprobs(model, prompts, completions, packed=True, pad_id=0)
        (out.logp * out.mask).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    _sync(device)
    reps = 3
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    _sync(device)
    train_rate = reps * n_seqs * (p_len + c_len) / (time.perf_counter() - t0)
    mfu = 6 * params * train_rate / peak
    note = (f"{params / 1e6:.0f} M parameters, {dtype}; generation {gen_rate:.0f} tokens/s; "
            f"trainer {train_rate:.0f} tokens/s; matmul {peak / 1e12:.1f} TFLOP/s")  # fmt: skip
    prefix = "gpu_smoke" if smoke else "gpu"
    return [
        # baseline = the card's measured matmul rate; ours = the trainer's model FLOPs rate
        report(Result(f"{prefix}_trainer_mfu", "FLOP/s", peak, 6 * params * train_rate, mfu,
                      0.3, mfu >= 0.3, m, note)),
    ]  # fmt: skip


if __name__ == "__main__":
    smoke = "--cpu-smoke" in sys.argv
    if not smoke and not torch.cuda.is_available():
        sys.exit("bench.gpu: no CUDA device here; `--cpu-smoke` runs its code on CPU")
    run(smoke)
