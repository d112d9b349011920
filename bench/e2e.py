"""End to end: the CPU demo (embedded SmolLM2-135M, its config, both roles) for a few steps.

One row: the busy share, the part of the wall clock the two stages that do the work
(generation and training) run, against everything else a step spends (scoring passes,
publishing and reloading weights, transfers, waits). Baseline = wall seconds per step,
ours = generation + training seconds per step, ratio = ours / baseline. The demo is
synchronous, so the share is at most 1; the target (our choice) is 0.9: at most a tenth of a
step in overhead. Each stage's share, and its tokens/s while it runs, are in the notes.

Each stage has both cores while it runs. The full run also times the same steps overlapped
(train.max_staleness=1), which shows what bounds a step on 2 cores: overlapped, the stages
share the cores instead of taking turns, and a step is no shorter.
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


def busy_and_wall(rows: list[dict]) -> tuple[float, float]:
    """(generation + training seconds, wall seconds) per step, over the steps after the first
    (which includes start-up)."""
    timed = rows[1:]
    busy = sum(r["sampler_gen_s"] + r["train_s"] for r in timed)
    wall = rows[-1]["time"] - rows[0]["time"]
    return busy / len(timed), wall / len(timed)


BUSY_TARGET = 0.9  # at most a tenth of each step outside generation and training


def run(quick: bool = False) -> list[Result]:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

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
    busy, wall = busy_and_wall(rows)
    gen_rate = sum(r["sampler_gen_tokens"] for r in timed) / sum(r["sampler_gen_s"] for r in timed)
    train_tokens = sum(sum(r["prompt_lens"]) + sum(r["completion_lens"]) for r in timed)
    train_rate = train_tokens / sum(r["train_s"] for r in timed)
    note = (f"{len(timed)} steps after the first, {wall:.1f} s/step; wall time: "
            + ", ".join(f"{k} {v:.0%}" for k, v in stage_shares(rows).items())
            + f"; while running: generation {gen_rate:.1f} tokens/s, "
            f"training {train_rate:.1f} tokens/s")  # fmt: skip
    if overlapped:
        per_step = (overlapped[-1]["time"] - overlapped[0]["time"]) / (len(overlapped) - 1)
        note += f"; the same steps overlapped (max_staleness 1): {per_step:.1f} s/step"
    return [
        report(Result("e2e_busy_share", "s/step", wall, busy, "ours/baseline", BUSY_TARGET,
                      machine(), note, quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
