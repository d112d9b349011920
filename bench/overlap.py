"""Pipeline overlap: the sampler generating batch k+1 while the trainer trains on batch k
(train.max_staleness: 1) against the strictly synchronous loop (max_staleness: 0).

Both are real launch.sh runs (sampler process + DeepSpeed trainer, ZeroMQ on loopback) with
a small random model, one thread per process. A calibration run first measures generation
and training times, then train.ppo_epochs is set so that they are comparable, which is where
overlap matters most (the limit is then 2x).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench.common import REPO, TINY_ENGINE, Result, launch_run, machine, report, steps_per_hour

CONFIG = REPO / "configs" / "cpu_demo.yaml"


SCENARIO = (
    "real launch.sh runs of a tiny random model, 1 trainer rank, one thread per "
    "process, {steps} steps, steps/h after the first; ours: train.max_staleness 1; "
    "baseline: the same run synchronous (max_staleness 0); train.ppo_epochs is set from "
    "a calibration run so that generation and training take about as long, the case "
    "most favourable to overlap (limit 2x), not a user's setting: at the demo's own "
    "settings see e2e_overlap_vs_synchronous; one run each"
)


def run(quick: bool = False) -> list[Result]:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

    steps = 3 if quick else 10
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        tiny = build_tiny_model(tmp / "tiny", ensure_embedded_base())
        common = [f"model.path={tiny}", TINY_ENGINE, "train.num_ranks=1", "eval.interval=0",
                  f"rollout.max_new_tokens={16 if quick else 64}",
                  "train.keep_versions=4"]  # fmt: skip
        if quick:  # the suite's smoke run: no calibration run, one epoch
            epochs, balance = 1, "not calibrated (--quick)"
        else:
            calib = launch_run(CONFIG, tmp, "calibrate", [*common, "train.total_steps=3"], True)
            gen = statistics.mean(r["sampler_gen_s"] + r["sampler_logprob_s"] for r in calib[1:])
            train = statistics.mean(r["train_s"] for r in calib[1:])
            epochs = max(1, min(20, round(gen / train)))
            balance = f"generation+scoring {gen:.2f} s vs training {train:.2f} s per epoch"
        timed = [*common, f"train.total_steps={steps}", f"train.ppo_epochs={epochs}"]
        rates = {}
        for staleness in (0, 1):
            rows = launch_run(CONFIG, tmp, f"staleness{staleness}",
                              [*timed, f"train.max_staleness={staleness}"], True)  # fmt: skip
            rates[staleness] = steps_per_hour(rows)
            staleness_seen = max(r["staleness"] for r in rows)
            assert staleness_seen <= staleness, f"staleness {staleness_seen} > bound {staleness}"
    note = f"{steps} steps, tiny model, 1 trainer rank; {balance}, so ppo_epochs={epochs}"
    return [
        report(Result.of("overlap_steps_per_hour", "steps/h", [rates[0]], [rates[1]],
                         "ours/baseline", 1.6, machine(), SCENARIO.format(steps=steps), note,
                         quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    run()
