"""Padding waste: trainer forward + backward of real GSM8K rollouts, padded against packed.

The (prompt, completion) lengths are the episodes of a CPU demo run (its metrics.jsonl keeps
them per step), so the length spread is the one the trainer really sees. Padded = the
rectangle of pad_pairs (left-padded prompts, right-padded completions), as HF trainers do,
in arrival order or sorted by length (what the trainer does with sdpa); packed = the pairs
back to back in one row with restarting positions (what it does with a flash_attention
kernel). All use micro-batches of the same size and compute the same log-probs.

One thread, as each trainer rank runs (OMP_NUM_THREADS=1), timed in CPU seconds: on a machine
shared with other work, wall time measures the other work as much as ours, while a single
thread's CPU time stays put (seen: wall times of 69 s and 155 s for the same forwards).

Tokens computed are counted, not derived: a hook on the model adds up the tokens of every
`input_ids` the trainer's code path (grpo.scoring.forward.pairs_logprobs) feeds it, padding
included, so a packer that padded would show it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import MODEL, REPO, Result, machine, quiet_hf, report
from grpo.scoring.forward import pairs_logprobs

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


def _step(
    model, sizes: list[tuple[int, int]], micro: int, packed: bool, vocab: int
) -> tuple[float, int]:
    """One forward + backward over `sizes` in micro-batches: (CPU seconds, tokens the model
    was fed, i.e. the elements of every input_ids it received, padding included)."""
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, vocab, p), rng.integers(0, vocab, c)) for p, c in sizes]
    fed = 0

    def count(_module, _args, kwargs) -> None:
        nonlocal fed
        fed += kwargs["input_ids"].numel()

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        t0 = time.process_time()
        for start in range(0, len(pairs), micro):
            chunk = pairs[start : start + micro]
            out = pairs_logprobs(
                model, [p for p, _ in chunk], [c for _, c in chunk], packed=packed, pad_id=0
            )
            (out.logp * out.mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.process_time() - t0, fed
    finally:
        hook.remove()


ROUNDS = 3  # each variant timed 3 times, alternating: the spread of a row


def run(quick: bool = False) -> list[Result]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)  # bench.run_all runs the next benchmark in this process


def _run(quick: bool) -> list[Result]:
    from grpo.core.batching import length_order
    from grpo.models.convert import ensure_embedded_base
    from grpo.models.loading import load_causal_lm
    from tests.tiny_model import build_tiny_model

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
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    computed: dict[str, int] = {}
    counted: dict[str, list[float]] = {name: [] for name in variants}  # per real token
    for _ in range(1 if quick else ROUNDS):  # alternate: no variant gets the warmer machine
        for name, (sizes, packed) in variants.items():
            seconds, computed[name] = _step(model, sizes, micro, packed, vocab)
            rounds[name].append(seconds)
            counted[name].append(computed[name] / sum(p + c for p, c in arrival))
    real = sum(p + c for p, c in arrival)
    per_real = {name: n / real for name, n in computed.items()}
    each = ", ".join(f"{k} " + " / ".join(f"{t:.1f}" for t in v) for k, v in rounds.items())
    note = (f"{len(arrival)} episodes from {source}, micro-batch {micro}, model {path.name}, "
            f"sdpa, 1 thread; tokens fed to the model per real token: "
            + ", ".join(f"{k} {v:.3f}" for k, v in per_real.items())
            + f"; CPU s of each round: {each}")  # fmt: skip
    m = machine()
    setup = (f"trainer forward + backward of {MODEL[quick]} on {len(arrival)} episodes from "
             f"{source}, micro-batches of {micro}, sdpa, one thread, CPU seconds per round; "
             "baseline: micro-batches padded to their longest in arrival order, what the "
             "trainer does without packing or sorting")  # fmt: skip
    return [
        # the target applies to ours: tokens computed per real token <= 1.05
        report(Result.of("padding_tokens_computed_per_real", "tokens", counted["padded"],
                         counted["packed"], "ours<=target", 1.05, m,
                         f"{setup}; ours: packed rows; tokens fed to the model counted", note,
                         quick)),
        report(Result.of("padding_step_time_packed", "CPU s", rounds["padded"], rounds["packed"],
                         "baseline/ours", 1.0, m, f"{setup}; ours: packed rows", note, quick)),
        report(Result.of("padding_step_time_length_sorted", "CPU s", rounds["padded"],
                         rounds["padded, length-sorted"], "baseline/ours", 1.0, m,
                         f"{setup}; ours: micro-batches of similar lengths", note, quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
