"""End to end: the CPU demo (embedded SmolLM2-135M, its config, both roles) for a few steps,
synchronous against overlapped.

One row: wall seconds per step (from the first step's end to the last one's) of the demo as
shipped, synchronous (train.max_staleness 0, the baseline: what a user runs) against the same
steps with the sampler generating batch k+1 while the trainer trains batch k
(train.max_staleness=1, ours), at the same settings, nothing tuned. Ratio = baseline / ours;
the target, 1.0, asks that overlap be no slower. Each stage's share of the synchronous run's
wall clock, and its tokens/s while it runs, are in the notes.

The busy share this benchmark used to report (generation + training over the wall clock) is at
most 1 by construction in a synchronous run: its arithmetic is a test
(tests/test_bench.py::test_e2e_busy_share_counts_generation_and_training), not a row.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.common import REPO, TINY_ENGINE, Result, launch_run, machine, report

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


SCENARIO = (
    "configs/cpu_demo.yaml as shipped ({model}, {ranks} trainer ranks, both roles on "
    "this machine), {steps} steps, wall seconds per step after the first; ours: "
    "train.max_staleness=1 (generation of batch k+1 overlaps training of batch k); "
    "baseline: the same config synchronous (max_staleness 0), what a user runs; one "
    "run each"
)


def run(quick: bool = False) -> list[Result]:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

    steps = 3 if quick else 4
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        overrides = ["eval.interval=0", f"train.total_steps={steps}"]
        if quick:
            tiny = build_tiny_model(tmp / "tiny", ensure_embedded_base())
            overrides += [f"model.path={tiny}", TINY_ENGINE, "rollout.max_new_tokens=16",
                          "train.num_ranks=1"]  # fmt: skip
        rows = launch_run(CONFIG, tmp, "e2e", overrides)
        overlapped = launch_run(CONFIG, tmp, "e2e_overlap", [*overrides, "train.max_staleness=1"])
    timed = rows[1:]  # the first step includes start-up
    busy, wall = busy_and_wall(rows)
    _, overlapped_wall = busy_and_wall(overlapped)
    gen_rate = sum(r["sampler_gen_tokens"] for r in timed) / sum(r["sampler_gen_s"] for r in timed)
    train_tokens = sum(sum(r["prompt_lens"]) + sum(r["completion_lens"]) for r in timed)
    train_rate = train_tokens / sum(r["train_s"] for r in timed)
    note = (f"{len(timed)} steps after the first; synchronous {wall:.1f} s/step, overlapped "
            f"{overlapped_wall:.1f} s/step; synchronous wall time: "
            + ", ".join(f"{k} {v:.0%}" for k, v in stage_shares(rows).items())
            + f" (busy share {busy / wall:.2f}); while running: generation {gen_rate:.1f} "
            f"tokens/s, training {train_rate:.1f} tokens/s")  # fmt: skip
    scenario = SCENARIO.format(model="tiny model" if quick else "SmolLM2-135M",
                               ranks=1 if quick else 2, steps=steps)  # fmt: skip
    return [
        report(Result.of("e2e_overlap_vs_synchronous", "s/step", [wall], [overlapped_wall],
                         "baseline/ours", 1.0, machine(), scenario, note, quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
