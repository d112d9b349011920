"""Padding waste: trainer forward + backward of real GSM8K rollouts, padded against packed.

The (prompt, completion) lengths are the episodes of a CPU demo run (its metrics.jsonl keeps
them per step), so the length spread is the one the trainer really sees. Padded = the
rectangle of pad_pairs (left-padded prompts, right-padded completions), as HF trainers do,
in arrival order or sorted by length (what the trainer does with sdpa); packed = the pairs
back to back in one row with restarting positions (what it does with a flash_attention
kernel). All use micro-batches of the same size and compute the same log-probs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bench.common import REPO, Result, machine, quiet_hf, report
from grpo.core.batching import micro_batch_tokens
from grpo.logprobs import pairs_logprobs

DEMO_METRICS = REPO / "checkpoints" / "cpu_demo" / "metrics.jsonl"
# A snapshot of a demo run's lengths, used when no demo run is on this machine.
SNAPSHOT = Path(__file__).resolve().parent / "data" / "demo_lengths.json"


def demo_lengths() -> tuple[list[tuple[int, int]], str]:
    """(prompt, completion) lengths of every episode of a demo run, and where they came from."""
    if DEMO_METRICS.is_file():
        rows = [json.loads(line) for line in DEMO_METRICS.read_text().splitlines() if line]
        pairs = [
            (p, c)
            for r in rows
            for p, c in zip(r.get("prompt_lens", []), r.get("completion_lens", []), strict=True)
        ]
        if pairs:
            return pairs, str(DEMO_METRICS.relative_to(REPO))
    return [tuple(x) for x in json.loads(SNAPSHOT.read_text())], str(SNAPSHOT.relative_to(REPO))


def _step(model, sizes: list[tuple[int, int]], micro: int, packed: bool, vocab: int) -> float:
    """One forward + backward over `sizes` in micro-batches; returns seconds."""
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, vocab, p), rng.integers(0, vocab, c)) for p, c in sizes]
    t0 = time.perf_counter()
    for start in range(0, len(pairs), micro):
        chunk = pairs[start : start + micro]
        out = pairs_logprobs(
            model, [p for p, _ in chunk], [c for _, c in chunk], packed=packed, pad_id=0
        )
        (out.logp * out.mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def computed_tokens(sizes: list[tuple[int, int]], micro: int, packed: bool) -> int:
    """Tokens the forwards over micro-batches of `micro` pairs compute."""
    return sum(
        micro_batch_tokens(sizes[s : s + micro], packed) for s in range(0, len(sizes), micro)
    )


def run(quick: bool = False) -> list[Result]:
    from grpo.core.batching import length_order
    from grpo.models import build_tiny_model, ensure_embedded_base, load_causal_lm

    quiet_hf()
    lengths, source = demo_lengths()
    base = ensure_embedded_base()
    path = base
    if quick:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp_dir:  # once loaded, it needs no files
            path = build_tiny_model(Path(tmp_dir) / "tiny", base)
            model = load_causal_lm(str(path), "float32")
    else:
        model = load_causal_lm(str(path), "float32")
    model.train()  # sdpa, the default kernel
    vocab = model.config.vocab_size
    micro = 8  # the demo's micro-batch
    arrival = lengths[: 8 if quick else 32]  # one rank's mini-batch (--quick: a micro-batch)
    variants = {
        "padded": (arrival, False),
        "padded, length-sorted": ([arrival[i] for i in length_order(arrival)], False),
        "packed": (arrival, True),
    }
    times = dict.fromkeys(variants, float("inf"))
    for _ in range(1 if quick else 2):  # alternate so no variant gets the warmer machine
        for name, (sizes, packed) in variants.items():
            times[name] = min(times[name], _step(model, sizes, micro, packed, vocab))
    real = sum(p + c for p, c in arrival)
    ratio = {name: computed_tokens(sizes, micro, packed) / real
             for name, (sizes, packed) in variants.items()}  # fmt: skip
    note = (f"{len(arrival)} episodes from {source}, micro-batch {micro}, model {path.name}, "
            f"sdpa; computed/real tokens: "
            + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items()))  # fmt: skip
    m = machine()
    base_t = times["padded"]
    return [
        # the target applies to ours: computed tokens per real token <= 1.05
        report(Result("padding_tokens_computed_per_real", "tokens", ratio["padded"],
                      ratio["packed"], ratio["padded"] / ratio["packed"], 1.05,
                      ratio["packed"] <= 1.05, m, note + "; target: ours <= 1.05")),
        report(Result("padding_step_time_packed", "s", base_t, times["packed"],
                      base_t / times["packed"], 1.0, base_t >= times["packed"], m, note)),
        report(Result("padding_step_time_length_sorted", "s", base_t,
                      times["padded, length-sorted"], base_t / times["padded, length-sorted"],
                      1.0, base_t >= times["padded, length-sorted"], m, note)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
