"""`python -m grpo eval RUN_DIR_OR_VERSION_OR_MODEL`: evaluate a finished run's saved versions
(or one version dir, or any model) on held-out questions and print a table: greedy pass@1,
format rate and, with --samples N, pass@k for each --k (the unbiased estimator,
grpo.eval.questions).

    python -m grpo eval checkpoints/cpu_demo                        base model and every version
    python -m grpo eval checkpoints/cpu_demo --versions 0,8 --samples 8 --k 1,4,8
    python -m grpo eval checkpoints/cpu_demo --versions 12 --show 5   and 5 of its answers
    python -m grpo eval checkpoints/cpu_demo/versions/v000008 --task math --num-questions 100
    python -m grpo eval /models/Qwen2.5-0.5B-Instruct --task math   any model dir (or a cached
                                                                     hub id, or 'embedded')

A run's config.yaml gives the model, the task and the prompt; the options change what is
evaluated. Version 0 is the run's initial model. Rows go to RUN_DIR/eval_versions.jsonl too. A
model outside a run is evaluated with the defaults (task gsm8k unless --task), its row printed
only: nothing is written into its directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from grpo.config import Config, ConfigError, load_config
from grpo.observe.metrics import append_jsonl
from grpo.weights.dirs import VERSION_MARKER

log = logging.getLogger("grpo.eval")

OUT_FILE = "eval_versions.jsonl"


class EvalCliError(ValueError):
    """Bad input to `python -m grpo eval`: the message says what to give instead."""


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,4,8, got {text!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m grpo eval", description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a run dir (with config.yaml) or one of its versions")
    p.add_argument("--task", help="the task to evaluate on (gsm8k, math, ...); default: the run's")
    p.add_argument("--test", default="", help="test rows (path); default: the task's test split")
    p.add_argument("--versions", type=_ints, help="which versions, e.g. 0,4,8; default: all")
    p.add_argument("--num-questions", type=int, help="default: the run's eval.num_questions")
    p.add_argument("--max-new-tokens", type=int, help="default: the run's eval.max_new_tokens")
    p.add_argument("--samples", type=int, help="answers sampled per question for pass@k")
    p.add_argument("--k", type=_ints, help="the k of each pass@k, e.g. 1,4,8 (<= --samples)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=INSTRUCTION",
        help="ask the questions again with this answer instruction in place of the task's "
        "(repeatable; added to the run's eval.prompt_variants)",
    )
    p.add_argument(
        "--show",
        type=int,
        default=0,
        metavar="N",
        help="print each version's greedy answers to the first N questions",
    )
    return p.parse_args(argv)


def _variants(entries: list[str]) -> list[dict]:
    """--variant's NAME=INSTRUCTION entries as eval.prompt_variants entries."""
    out = []
    for entry in entries:
        name, sep, instruction = entry.partition("=")
        if not sep or not instruction.strip():
            raise EvalCliError(f"--variant {entry!r}: expected NAME=INSTRUCTION")
        out.append({"name": name.strip(), "instruction": instruction})
    return out


def run_and_versions(path: Path) -> tuple[Path, list[int]]:
    """The run dir and the versions `path` names: a run dir's saved ones (and 0, the initial
    model), or the one version dir given."""
    path = path.resolve()
    if re.fullmatch(r"v\d+", path.name) and path.parent.name == "versions":
        return path.parent.parent, [int(path.name[1:])]
    if not (path / "config.yaml").is_file():
        raise EvalCliError(f"{path} is not a run dir (no config.yaml) nor a versions/vNNNNNN dir")
    saved = sorted(int(p.name[1:]) for p in (path / "versions").glob("v*") if p.is_dir())
    return path, [0, *(v for v in saved if v != 0)]


def is_model(path: Path) -> bool:
    """A model to evaluate on its own: 'embedded', a cached hub id, or a model dir outside a
    run (a run's version dirs are evaluated with their run's config)."""
    from grpo.models.embedded import EMBEDDED, ModelError, require_model_dir

    if str(path) == EMBEDDED:
        return True
    try:
        found = require_model_dir(str(path))
    except ModelError:
        return False
    return not (found / VERSION_MARKER).is_file()


def eval_config(run_dir: Path, args: argparse.Namespace, model: str = "") -> Config:
    """The run's config, pointed at `run_dir` wherever it now is, with the options applied;
    with `model`, the defaults with that model (run_dir: a scratch dir for the evaluation)."""
    overrides = [f"output_dir={run_dir.parent}", f"name={run_dir.name}", "eval.interval=1"]
    if model:
        overrides.append(f"model.path={model}")
    if args.task:  # another task: its own reward and test split, not the run's
        overrides += [f"data.task={args.task}", "data.reward=", "data.test="]
    if args.task or args.test:  # one dataset named: not the run's mixture
        overrides += ["data.mixture=[]", "data.train="]
    if args.samples is not None and args.k is None:  # the run's k may not fit the new n
        overrides.append("eval.k=[]")
    if args.variant:
        overrides.append(f"eval.prompt_variants={json.dumps(_variants(args.variant))}")
    for key, value in (
        ("data.test", args.test),
        ("eval.num_questions", args.num_questions),
        ("eval.max_new_tokens", args.max_new_tokens),
        ("eval.samples", args.samples),
        ("eval.k", args.k),
    ):
        if value not in (None, ""):
            overrides.append(f"{key}={value}")
    return load_config(None if model else run_dir / "config.yaml", overrides)


def table(rows: list[dict]) -> str:
    """The markdown table of `rows`; a mixture's entries get a pass@1 column each."""
    keys = {k for r in rows for k in r}
    passes = sorted(
        (k for k in keys if k.startswith("pass@") and "/" not in k), key=lambda k: int(k[5:])
    )
    sources = sorted(k.removeprefix("accuracy/") for k in keys if k.startswith("accuracy/"))
    variants = sorted({k.partition("@")[2] for k in keys if k.startswith("format_rate@")})
    head = ["version", "pass@1 (greedy)", "format", "degenerate", *passes]
    head += [f"{name} pass@1" for name in sources]
    head += [f"{part} @{name}" for name in variants for part in ("pass@1", "format")]
    head += ["questions", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["version"])]
        numbers = ["accuracy", "format_rate", "degenerate_frac", *passes]
        numbers += [f"accuracy/{s}" for s in sources]
        numbers += [f"{k}@{name}" for name in variants for k in ("accuracy", "format_rate")]
        cells += [f"{r[k]:.3f}" if k in r else "-" for k in numbers]
        cells += [str(r["n"]), f"{r['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def evaluate_versions(
    cfg: Config,
    versions: list[int],
    progress: bool = True,
    out: Path | None = None,
    show: int = 0,
) -> list[dict]:
    """Each version in turn, with the HF policy (a LoRA run's adapter on its base model);
    `show`: print its greedy answers to the first `show` questions (grpo.observe.samples)."""
    from grpo.eval import questions as q
    from grpo.models.loading import load_tokenizer, resolve_model_path
    from grpo.models.shared_policy import SharedPolicy
    from grpo.observe import samples
    from grpo.plan import check_names
    from grpo.rollout.hf import HFRollout
    from grpo.rollout.multi_turn import with_tools
    from grpo.tasks import RewardRunner, run_reward, task_for
    from grpo.weights.dirs import verify_version, version_dir
    from grpo.weights.in_use import PolicyCopy
    from grpo.weights.version import Version

    check_names(cfg)
    task = task_for(cfg)
    reward_fn = run_reward(task, cfg.data.reward)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    prompts = q.eval_prompts(cfg, task, tokenizer)
    variants = q.variant_prompts(cfg, task, tokenizer)
    spec = q.EvalSpec.from_config(cfg)
    shared = SharedPolicy(cfg, model_path)
    policy, copy = shared.module(), PolicyCopy(shared)
    markers = task.count_markers
    for v in versions:  # all present before the first (minutes of) generation
        if v:
            verify_version(version_dir(cfg.run_dir, v))
    engine, rows = with_tools(HFRollout(policy, tokenizer), cfg.rollout, tokenizer), []
    with RewardRunner(reward_fn, cfg.reward.workers, cfg.reward.timeout_s) as rewards:
        for v in versions:
            if v:
                copy.load(Version.from_dir(version_dir(cfg.run_dir, v), v))
            row, results = q.evaluate_answers(
                engine, prompts, tokenizer, rewards, spec, v, progress, markers
            )
            if show > 0:
                print(samples.show(samples.eval_rows(results[:show], v, prompts, tokenizer.decode)))
            for name, asked in variants.items():
                other, _ = q.evaluate_answers(
                    engine, asked, tokenizer, rewards, spec, v, progress, markers
                )
                row |= q.variant_row(other, name)
            log.info("v%d: %s", v, table([row]).splitlines()[-1])
            if out is not None:
                append_jsonl(out, row)
            rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [eval] %(message)s", datefmt="%X")
    try:
        if is_model(args.path):
            return _evaluate_model(args)
        run_dir, versions = run_and_versions(args.path)
        if args.versions is not None:
            missing = sorted(set(args.versions) - set(versions))
            if missing:
                raise EvalCliError(f"{run_dir} has no versions {missing}; it has {versions}")
            versions = sorted(args.versions)
        cfg = eval_config(run_dir, args)
        rows = evaluate_versions(cfg, versions, out=run_dir / OUT_FILE, show=args.show)
    except (EvalCliError, ConfigError, ValueError, FileNotFoundError) as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    print(f"\n{cfg.data.task}: {len(rows)} version(s) of {run_dir}\n{table(rows)}")
    if len(rows) > 1:  # the change from the first version asked to the last, per prompt set
        from grpo.eval.significance import accuracy_change

        change = "; ".join(accuracy_change(rows[0], rows[-1]))
        print(f"v{rows[0]['version']} -> v{rows[-1]['version']}: {change}")
    return 0


def _evaluate_model(args: argparse.Namespace) -> int:
    """A model outside a run, as version 0 of a run that never trained."""
    import tempfile

    if args.versions not in (None, [0]):
        raise EvalCliError(f"{args.path} is a model, not a run: it has no versions to choose")
    with tempfile.TemporaryDirectory(prefix="grpo-eval-") as scratch:
        cfg = eval_config(Path(scratch) / "eval", args, model=str(args.path))
        rows = evaluate_versions(cfg, [0], show=args.show)
    print(f"\n{cfg.data.task}: {args.path}\n{table(rows)}")
    return 0
