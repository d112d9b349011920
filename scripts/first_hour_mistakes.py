"""46 mistakes a new user plausibly makes in the first hour, each run as that user would run it
(issue 64's Done-when): from a directory of their own holding a copy of configs/cpu_demo.yaml
(with two trainer ranks, as the issue tried it), `bash launch.sh CONFIG`, `grpo check CONFIG`
or a `grpo` tool, under a timeout. Prints a markdown table: seconds, exit code, output lines,
verdict.

    .venv/bin/python -m scripts.first_hour_mistakes [--only NAME ...] [--timeout S]

The verdict is `good` when the command did what the docs promise for that case: for a config
or usage error exit 2 and one line that names the cause (docs/running.md, `grpo --help`); for
`--help`, exit 0 and a usage text; for a reward that fails on every answer, a stop that is not
`run complete`, names the reward and is not restarted (README, "The reward contract").
Anything else is `bad`, with why. A case that starts a real run (the broken reward) is a 1-step
run of the embedded model: a minute or two on 2 cores, and a demo-sized run's memory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = REPO / ".venv" / "bin" / "python"
GRPO = [str(PY), "-m", "grpo"]
LAUNCH = ["bash", str(REPO / "launch.sh")]
DEMO = REPO / "configs" / "cpu_demo.yaml"
BASE = REPO / "checkpoints" / "base"  # the converted embedded model (launch.sh makes it)

RAISING_REWARD = """
def score(completion, sample):
    raise KeyError("gold")  # a column the rows do not have
"""
GOOD_REWARD = """
def score(completion, sample):
    return 1.0 if sample["answer"].split("####")[-1].strip() in completion else 0.0
"""
ONE_ARG_REWARD = """
def score(completion):
    return 0.0
"""


@dataclass
class Case:
    name: str
    mistake: str
    # (the case's dir, the config's path there) -> the command; run with cwd = the case's dir
    command: Callable[[Path, Path], list[str]]
    kind: str = "config"  # config: exit 2, one line naming it; help: exit 0 + usage; run: see doc
    names: list[str] = field(default_factory=list)  # what the line must name
    edit: Callable[[str], str] | None = None  # the config text, changed
    setup: Callable[[Path], None] | None = None  # files in the case's dir
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 180.0


def launch(*args: str) -> Callable[[Path, Path], list[str]]:
    return lambda d, cfg: [*LAUNCH, cfg.name, *args]


def check(*args: str) -> Callable[[Path, Path], list[str]]:
    return lambda d, cfg: [*GRPO, "check", cfg.name, *args]


def tool(*args: str) -> Callable[[Path, Path], list[str]]:
    return lambda d, cfg: [*GRPO, *args]


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


def write(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def model_without_tokenizer(d: Path) -> None:
    (d / "my_model").mkdir()
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        (d / "my_model" / f).symlink_to(BASE / f)


def test_rows_without_columns(d: Path) -> None:
    (d / "test.jsonl").write_text('{"problem": "1 + 1?", "solution": "2"}\n' * 4)


def a_file_where_the_dir_goes(d: Path) -> None:
    (d / "runs").write_text("my notes, not a directory\n")


GSM8K = ["data.task=gsm8k", f"data.train={REPO}/data/gsm8k/train.jsonl"]
LORA = ["model.lora.enabled=true", "model.lora.target_modules=[q_prj, v_proj]"]

CASES = [
    # Keys: typos, and the names TRL and verl use.
    Case(
        "yaml_section_typo",
        "`trian:` for `train:` in the YAML",
        launch(),
        names=["trian"],
        edit=replace("train:\n", "trian:\n"),
    ),
    Case(
        "yaml_key_typo",
        "`total_step:` in the YAML",
        launch(),
        names=["total_step"],
        edit=replace("total_steps: 8", "total_step: 8"),
    ),
    Case(
        "override_key_typo",
        "`train.totl_steps=2`",
        launch("train.totl_steps=2"),
        names=["totl_steps"],
    ),
    Case(
        "override_without_equals",
        "`train.total_steps 2` (a space for the =)",
        launch("train.total_steps", "2"),
        names=["train.total_steps"],
    ),
    Case(
        "trl_learning_rate_yaml",
        "TRL's `learning_rate:` at the YAML's top",
        launch(),
        names=["learning_rate", "train.lr"],
        edit=lambda t: t + "learning_rate: 1.0e-5\n",
    ),
    Case(
        "trl_learning_rate",
        "`train.learning_rate=1e-5`",
        check("train.learning_rate=1e-5"),
        names=["learning_rate", "train.lr"],
    ),
    Case(
        "trl_num_generations",
        "TRL's `num_generations=8`",
        launch("num_generations=8"),
        names=["num_generations", "rollout.group_size"],
    ),
    Case("trl_beta", "TRL's `beta=0.04`", check("beta=0.04"), names=["beta", "kl_loss_coef"]),
    Case(
        "trl_max_completion_length",
        "TRL's `max_completion_length=64`",
        launch("max_completion_length=64"),
        names=["max_completion_length", "max_new_tokens"],
    ),
    Case(
        "verl_rollout_n",
        "verl's `actor_rollout_ref.rollout.n=8`",
        launch("actor_rollout_ref.rollout.n=8"),
        names=["rollout.group_size"],
    ),
    Case("loss_dapo", "`algo.loss=dapo` (a peer's name)", launch("algo.loss=dapo"), names=["dapo"]),
    Case(
        "advantage_remax", "`algo.advantage=remax`", check("algo.advantage=remax"), names=["remax"]
    ),
    Case("loss_typo", "`algo.loss=grp0`", launch("algo.loss=grp0"), names=["grp0", "grpo"]),
    # Values.
    Case("lr_not_a_number", "`train.lr=fast`", launch("train.lr=fast"), names=["train.lr"]),
    Case(
        "questions_not_per_rank",
        "`rollout.questions_per_step=3` on two ranks",
        launch("rollout.questions_per_step=3"),
        names=["questions_per_step"],
    ),
    Case("backend_typo", "`rollout.backend=vlm`", launch("rollout.backend=vlm"), names=["vlm"]),
    # What the run opens.
    Case(
        "model_dir_missing",
        "`model.path=my_model` (not there)",
        launch("model.path=my_model"),
        names=["model.path", "my_model"],
    ),
    Case(
        "hub_id_not_cached",
        "a hub id never downloaded",
        launch("model.path=Qwen/Qwen2.5-0.5B"),
        names=["model.path", "Qwen/Qwen2.5-0.5B"],
    ),
    Case(
        "model_without_tokenizer",
        "a model dir without its tokenizer files",
        check("model.path=my_model"),
        names=["tokenizer"],
        setup=model_without_tokenizer,
    ),
    Case(
        "model_without_tokenizer_launch",
        "the same, started with launch.sh",
        launch("model.path=my_model"),
        names=["tokenizer"],
        setup=model_without_tokenizer,
    ),
    Case("task_typo", "`data.task=gsm9k`", launch("data.task=gsm9k"), names=["gsm9k", "gsm8k"]),
    Case(
        "test_rows_without_columns",
        "`data.test` rows without the task's columns",
        check(*GSM8K, "data.test=test.jsonl"),
        names=["data.test"],
        setup=test_rows_without_columns,
    ),
    Case(
        "train_file_missing",
        "`data.train=train.jsonl` (not there)",
        launch("data.task=gsm8k", "data.train=train.jsonl"),
        names=["data.train", "train.jsonl"],
    ),
    Case(
        "output_dir_unwritable",
        "`output_dir` below a file",
        lambda d, cfg: [*GRPO, "check", cfg.name, f"output_dir={d}/runs/out"],
        names=["output_dir"],
        setup=a_file_where_the_dir_goes,
    ),
    Case(
        "deepspeed_config_missing",
        "`train.deepspeed_config=zero4.json`",
        launch("train.deepspeed_config=configs/deepspeed/zero4.json"),
        names=["zero4.json"],
    ),
    Case("lora_target_typo", "`target_modules=[q_prj, v_proj]`", check(*LORA), names=["q_prj"]),
    Case(
        "lora_target_typo_launch",
        "the same, started with launch.sh",
        launch(*LORA),
        names=["q_prj"],
    ),
    # Rewards.
    Case(
        "reward_raises",
        "a reward that raises on every answer (a 1-step run)",
        launch(
            "data.reward=my_reward:score",
            "train.total_steps=1",
            "eval.interval=0",
            "train.num_ranks=1",
        ),
        kind="run",
        names=["my_reward"],
        setup=write("my_reward.py", RAISING_REWARD),
        timeout=600,
    ),
    Case(
        "reward_function_missing",
        "`data.reward=my_reward:scroe`",
        launch("data.reward=my_reward:scroe"),
        names=["scroe"],
        setup=write("my_reward.py", GOOD_REWARD),
    ),
    Case(
        "reward_module_missing",
        "`data.reward=my_rewards:score` (no such file)",
        check("data.reward=my_rewards:score"),
        names=["my_rewards"],
        setup=write("my_reward.py", GOOD_REWARD),
    ),
    Case(
        "reward_one_argument",
        "a reward taking only the completion",
        launch("data.reward=my_reward:score"),
        names=["data.reward"],
        setup=write("my_reward.py", ONE_ARG_REWARD),
    ),
    # Files, ports, the shell.
    Case(
        "yaml_syntax",
        "a YAML tab / bad indentation",
        launch(),
        names=["cfg.yaml"],
        edit=replace("  total_steps: 8", "\ttotal_steps: 8"),
    ),
    Case(
        "config_path_typo",
        "`bash launch.sh cpu_dmeo.yaml`",
        lambda d, cfg: [*LAUNCH, "cpu_dmeo.yaml"],
        names=["cpu_dmeo.yaml"],
    ),
    Case("port_in_use", "port 5555 held by another program", launch(), names=["5555"]),
    Case(
        "resume_nothing_saved",
        "`--resume` on a run never started",
        launch("--resume"),
        names=["resume"],
    ),
    Case("role_typo", "`ROLE=trainr`", launch(), names=["ROLE", "trainr"], env={"ROLE": "trainr"}),
    Case(
        "restarts_knob_unit",
        "`GRPO_MAX_RESTARTS=5s`",
        launch(),
        names=["GRPO_MAX_RESTARTS"],
        env={"GRPO_MAX_RESTARTS": "5s"},
    ),
    Case(
        "tool_typo",
        "`grpo chek CONFIG`",
        lambda d, cfg: [*GRPO, "chek", cfg.name],
        names=["chek", "check"],
    ),
    # Every tool's --help.
    Case("check_help", "`grpo check --help`", tool("check", "--help"), kind="help"),
    Case("eval_help", "`grpo eval --help`", tool("eval", "--help"), kind="help"),
    Case("samples_help", "`grpo samples --help`", tool("samples", "--help"), kind="help"),
    Case("merge_lora_help", "`grpo merge-lora --help`", tool("merge-lora", "--help"), kind="help"),
    Case("clean_help", "`grpo clean --help`", tool("clean", "--help"), kind="help"),
    Case("keys_help", "`grpo keys --help`", tool("keys", "--help"), kind="help"),
    Case("launch_env_help", "`grpo launch-env --help`", tool("launch-env", "--help"), kind="help"),
    Case("launch_help", "`grpo launch --help`", tool("launch", "--help"), kind="help"),
]


def demo_copy(d: Path, case: Case) -> Path:
    """The user's config: the demo's, with two trainer ranks and its runs under the case's dir."""
    text = DEMO.read_text()
    text = text.replace("  num_ranks: 1\n", "  num_ranks: 2\n", 1)
    text = text.replace("name: cpu_demo\n", f"name: fh_{case.name}\noutput_dir: {d}/out\n", 1)
    if case.edit:
        text = case.edit(text)
    cfg = d / "cfg.yaml"
    cfg.write_text(text)
    return cfg


def verdict(case: Case, code: int | None, lines: list[str]) -> str:
    text = "\n".join(lines)
    missing = [n for n in case.names if n.lower() not in text.lower()]
    if code is None:
        return "bad: timed out"
    if case.kind == "help":
        if code == 0 and lines and "usage" in text.lower():
            return "good"
        return f"bad: exit {code}" if code else "bad: no usage"
    if case.kind == "run":
        if code == 0 or "run complete" in text:
            return "bad: the run completed"
        if text.count("restarting it") > text.count("restart called off"):
            return "bad: restarted"
        return f"bad: does not name {missing}" if missing else "good"
    why = []
    if code != 2:
        why.append(f"exit {code}")
    if missing:
        why.append(f"does not name {missing}")
    if len(lines) != 1:
        why.append(f"{len(lines)} lines")
    return "bad: " + ", ".join(why) if why else "good"


def run(case: Case, timeout: float | None) -> dict:
    d = Path(tempfile.mkdtemp(prefix=f"fh_{case.name}_"))
    held = None
    try:
        cfg = demo_copy(d, case)
        if case.setup:
            case.setup(d)
        if case.name == "port_in_use":
            held = socket.socket()
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a run's TIME_WAIT
            try:
                held.bind(("127.0.0.1", 5555))
                held.listen()
            except OSError:  # another program holds it already: the same mistake
                held.close()
                held = None
        env = {**os.environ, **case.env}
        env.pop("GRPO_USER_DIR", None)
        cmd = case.command(d, cfg)
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=d,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout or case.timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the command's own process group: its roles
            output, _ = proc.communicate(timeout=60)
            code = None
        seconds = time.monotonic() - start
        lines = [line for line in output.splitlines() if line.strip()]
        words = ["grpo", *cmd[3:]] if cmd[:3] == GRPO else ["bash launch.sh", *cmd[2:]]
        shown = " ".join(f"{k}={v}" for k, v in case.env.items()) + " " + " ".join(words)
        return {"case": case, "seconds": seconds, "code": code, "lines": lines,
                "verdict": verdict(case, code, lines), "command": shown.strip()}  # fmt: skip
    finally:
        if held:
            held.close()
        shutil.rmtree(d, ignore_errors=True)


def cell(text: str, width: int = 160) -> str:
    text = re.sub(r"\s+", " ", text).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="run only these cases")
    parser.add_argument("--timeout", type=float, help="seconds a case may run (else its own)")
    parser.add_argument("--logs", type=Path, help="write each case's whole output to DIR/NAME.txt")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    assert len({c.name for c in CASES}) == len(CASES) == 46, len(CASES)
    if not BASE.joinpath("config.json").exists():
        print(f"no converted model in {BASE}: run `{PY} -m grpo.models.convert` first")
        return 2
    rows = []
    print("| # | mistake | command | s | exit | lines | verdict | first line of the output |")
    print("|---|---|---|---|---|---|---|---|")
    for i, case in enumerate(cases, 1):
        r = run(case, args.timeout)
        rows.append(r)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            (args.logs / f"{case.name}.txt").write_text("\n".join(r["lines"]) + "\n")
        first = r["lines"][0] if r["lines"] else ""
        if case.kind == "run" and r["lines"]:  # the line that says why the run stopped
            said = [ln for ln in r["lines"] if "error" in ln.lower() or "stop" in ln.lower()]
            first = said[-1] if said else r["lines"][-1]
        code = "timeout" if r["code"] is None else r["code"]
        print(f"| {i} | {cell(case.mistake, 60)} | `{cell(r['command'], 70)}` | "
              f"{r['seconds']:.1f} | {code} | {len(r['lines'])} | {r['verdict']} | "
              f"{cell(first)} |", flush=True)  # fmt: skip
    good = sum(r["verdict"] == "good" for r in rows)
    print(f"\n{good} of {len(rows)} good.")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
