"""End to end: the CPU demo (embedded SmolLM2-135M, its config, both roles) for a few steps.

Generation tokens/s and trainer tokens/s are each reported twice: while the stage runs
(baseline) and over the wall clock of the whole loop (ours); their ratio is how much of the
wall clock the stage keeps busy. The share of wall time each stage takes is in the notes.

The demo is synchronous: each stage has both cores while it runs. The full run also times the
same steps overlapped (train.max_staleness=1), which shows what bounds the shares on 2 cores:
overlapped, the stages share the cores instead of taking turns, and a step is no shorter.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import REPO, Result, launch_run, machine, report

CONFIG = REPO / "configs" / "cpu_demo.yaml"


def stage_shares(rows: list[dict]) -> dict[str, float]:
    """Fraction of the wall clock between the first and last step's end spent in each stage."""
    timed = rows[1:]
    wall = rows[-1]["time"] - rows[0]["time"]
    shares = {
        "generate": sum(r["sampler_gen_s"] for r in timed) / wall,
        "score log-probs": sum(r["sampler_logprob_s"] for r in timed) / wall,
        "train": sum(r["train_s"] for r in timed) / wall,
        "publish weights": sum(r["publish_s"] for r in timed) / wall,
    }
    shares["other (reload, transfer, waits)"] = max(0.0, 1 - sum(shares.values()))
    return shares


def run(quick: bool = False) -> list[Result]:
    from grpo.models import build_tiny_model, ensure_embedded_base

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        overrides = ["eval.interval=0", f"train.total_steps={3 if quick else 4}"]
        if quick:
            tiny = build_tiny_model(tmp / "tiny", ensure_embedded_base())
            overrides += [f"model.path={tiny}", "rollout.max_new_tokens=16", "train.num_ranks=1"]
        rows = launch_run(CONFIG, tmp, "e2e", overrides)
        overlapped = [] if quick else launch_run(CONFIG, tmp, "e2e_overlap",
                                                 [*overrides, "train.max_staleness=1"])  # fmt: skip
    timed = rows[1:]  # the first step includes start-up
    wall = rows[-1]["time"] - rows[0]["time"]
    gen_tokens = sum(r["sampler_gen_tokens"] for r in timed)
    gen_s = sum(r["sampler_gen_s"] for r in timed)
    train_tokens = sum(sum(r["prompt_lens"]) + sum(r["completion_lens"]) for r in timed)
    train_s = sum(r["train_s"] for r in timed)
    shares = stage_shares(rows)
    note = (f"{len(timed)} steps after the first, {wall / len(timed):.1f} s/step; wall time: "
            + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))  # fmt: skip
    if overlapped:
        per_step = (overlapped[-1]["time"] - overlapped[0]["time"]) / (len(overlapped) - 1)
        note += f"; the same steps overlapped (max_staleness 1): {per_step:.1f} s/step"
    m = machine()
    gen_rate, gen_wall = gen_tokens / gen_s, gen_tokens / wall
    train_rate, train_wall = train_tokens / train_s, train_tokens / wall
    # target (our choice): each stage keeps at least half of the wall clock busy
    return [
        report(Result("e2e_generated_tokens_per_s", "tokens/s", gen_rate, gen_wall,
                      gen_wall / gen_rate, 0.5, gen_wall / gen_rate >= 0.5, m, note)),
        report(Result("e2e_trainer_tokens_per_s", "tokens/s", train_rate, train_wall,
                      train_wall / train_rate, 0.5, train_wall / train_rate >= 0.5, m, note)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
