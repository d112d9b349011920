"""The GPU check: `python -m bench.gpu_check` runs every shipped GSM8K config for a few steps
and the GPU recipe (configs/gpu_smollm2.yaml) in full, each through `bash launch.sh` exactly as
a user starts it, on whatever GPUs this node has, and prints one table:

    config | exit | steps | s/step | generation tokens/s | trainer tokens/s | peak GiB trainer
    | peak GiB sampler | eval format / accuracy / degenerate (first -> last)

then one line: the seconds per GB to broadcast the recipe's model from one rank to another
(bench.broadcast: NCCL between two GPUs where the node has two, else gloo). The table also
goes to bench/results/gpu_check.md with the date and the device. Peak memory is what each
role's process allocated on its GPU at most (on a CPU node: its peak resident set).

    python -m bench.gpu_check                     # all of it (about 15 minutes on one H100)
    python -m bench.gpu_check --steps 2 --no-recipe
    python -m bench.gpu_check --only gsm8k_grpo,gsm8k_ppo  -- train.num_ranks=2
Arguments after `--` are config overrides given to every run. The test suite runs this same
code on CPU with a tiny model (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, RESULTS, loopback_overrides, machine

RECIPE = "gpu_smollm2"


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in (REPO / "configs").glob("gsm8k_*.yaml"))


@dataclass(frozen=True)
class CheckRow:
    config: str
    exit_code: int
    steps: int
    s_per_step: float | None
    gen_tokens_per_s: float | None
    trainer_tokens_per_s: float | None
    trainer_peak_gib: float | None
    sampler_peak_gib: float | None
    # {"version", "format_rate", "accuracy", "degenerate_frac", "degen_alarms"} of the first eval
    eval_first: dict | None
    eval_last: dict | None
    log_tail: str = ""


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(config: str, exit_code: int, wall_s: float, run_dir: Path, tail: str) -> CheckRow:
    """One table row from a run's metrics.jsonl and eval.jsonl."""
    rows, evals = read_rows(run_dir / "metrics.jsonl"), read_rows(run_dir / "eval.jsonl")
    if len(rows) > 1:  # from the first step's end to the last one's: start-up not counted
        s_per_step = (rows[-1]["time"] - rows[0]["time"]) / (len(rows) - 1)
    else:
        s_per_step = wall_s / len(rows) if rows else None
    peaks = {key: [r[key] for r in rows if key in r]
             for key in ("trainer_peak_mem_gib", "sampler_peak_mem_gib")}  # fmt: skip
    keep = ("version", "format_rate", "accuracy", "degenerate_frac", "degen_alarms")
    return CheckRow(
        config=config,
        exit_code=exit_code,
        steps=len(rows),
        s_per_step=s_per_step,
        gen_tokens_per_s=_mean([r["sampler_gen_tokens_per_s"] for r in rows]),
        trainer_tokens_per_s=_mean([r["trainer_tokens_per_s"] for r in rows]),
        trainer_peak_gib=max(peaks["trainer_peak_mem_gib"], default=None),
        sampler_peak_gib=max(peaks["sampler_peak_mem_gib"], default=None),
        eval_first={k: evals[0][k] for k in keep if k in evals[0]} if evals else None,
        eval_last={k: evals[-1][k] for k in keep if k in evals[-1]} if evals else None,
        log_tail="" if exit_code == 0 else tail,
    )


def run_limited(cmd: list[str], timeout_s: float) -> tuple[int, str]:
    """`cmd` in the repository, output unbuffered, killed after `timeout_s`: its exit code
    (124 when killed) and the tail of what it printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
        return done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:  # killed; launch.sh's roles follow their launcher
        return 124, f"timed out after {timeout_s:.0f} s: {str(e.stderr)[-2000:]}"


def run_config(config: str, out_dir: Path, overrides: list[str], timeout_s: float) -> CheckRow:
    """`bash launch.sh configs/<config>.yaml` with `overrides`, both roles on this node."""
    cmd = [
        "bash",
        str(REPO / "launch.sh"),
        str(REPO / "configs" / f"{config}.yaml"),
        f"output_dir={out_dir}",
        f"name={config}",
        *loopback_overrides(),
        *overrides,
    ]
    t0 = time.monotonic()
    code, tail = run_limited(cmd, timeout_s)
    return summarise(config, code, time.monotonic() - t0, out_dir / config, tail)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _eval(e: dict | None) -> str:
    if e is None:
        return "-"
    degenerate = _num(e.get("degenerate_frac"), ".2f")
    return f"v{e['version']} {e['format_rate']:.2f} / {e['accuracy']:.3f} / {degenerate}"


def table(rows: list[CheckRow]) -> str:
    lines = [
        "| config | exit | steps | s/step | generation tokens/s | trainer tokens/s "
        "| peak GiB trainer | peak GiB sampler "
        "| eval format / accuracy / degenerate (first -> last) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        evals = "-" if r.eval_first is None else f"{_eval(r.eval_first)} -> {_eval(r.eval_last)}"
        lines.append(
            f"| {r.config} | {r.exit_code} | {r.steps} | {_num(r.s_per_step, '.1f')} "
            f"| {_num(r.gen_tokens_per_s, ',.0f')} | {_num(r.trainer_tokens_per_s, ',.0f')} "
            f"| {_num(r.trainer_peak_gib, '.2f')} | {_num(r.sampler_peak_gib, '.2f')} | {evals} |"
        )
    return "\n".join(lines)


def device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"no GPU ({machine()})"
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)} x {names[0]}, torch {torch.__version__}"


def run(
    configs: list[str],
    steps: int,
    recipe: bool,
    overrides: list[str],
    out_dir: Path,
    timeout_s: float = 1800,
) -> list[CheckRow]:
    """Each config for `steps` steps (no eval, state at the end only), then the recipe as
    shipped; prints the table as it grows and returns its rows."""
    short = [f"train.total_steps={steps}", "eval.interval=0", "train.state_interval=0"]
    rows = []
    for config in configs:
        rows.append(run_config(config, out_dir, [*short, *overrides], timeout_s))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    if recipe:
        rows.append(run_config(RECIPE, out_dir, overrides, timeout_s))
    return rows


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    own, overrides = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=3, help="steps per shipped config")
    parser.add_argument("--only", default="", help="comma-separated config names (no .yaml)")
    parser.add_argument("--no-recipe", action="store_true", help=f"skip configs/{RECIPE}.yaml")
    parser.add_argument("--out", default="", help="run dirs go here (default: a temp dir)")
    args = parser.parse_args(own)
    configs = [c for c in args.only.split(",") if c] or shipped_configs()
    unknown = [c for c in configs if not (REPO / "configs" / f"{c}.yaml").is_file()]
    if unknown:
        print(f"gpu_check: no configs/{unknown[0]}.yaml", file=sys.stderr)
        return 2
    device = device_name()
    print(f"GPU check on {device}: {', '.join(configs)}"
          f"{'' if args.no_recipe else f' + {RECIPE}'}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        out = Path(args.out or tmp)
        rows = run(configs, args.steps, not args.no_recipe, overrides, out)
    text = table(rows)
    from bench import broadcast  # imports torch: after the runs, as device_name does

    try:  # the weights.mode collective transport between GPUs (issue 42)
        weights = broadcast.line(broadcast.model_numbers())
    except Exception as e:  # a failed measure is a line of the report, and a failed check
        why = (str(e) or type(e).__name__).splitlines()[-1]
        weights, failed = f"weights broadcast failed: {why}", True
    else:
        failed = False
    stamp = datetime.date.today().isoformat()
    report = f"GPU check, {stamp}, {device}\n\n{text}\n\n{weights}\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS / "gpu_check.md.tmp"
    tmp.write_text(report)
    os.replace(tmp, RESULTS / "gpu_check.md")
    print(f"\n{report}")
    for r in rows:
        if r.exit_code:
            print(f"--- {r.config} exited {r.exit_code}:\n{r.log_tail}", file=sys.stderr)
    return 1 if failed or any(r.exit_code for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
