"""One launch path for CPU and GPU: the trainer's command line, each role's GPUs, the workers'
arguments. The integration tests run this same path end to end on CPU."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections import namedtuple
from pathlib import Path

import pytest

from grpo.cli import without_launcher_args
from grpo.config import ConfigError, load_config
from grpo.runtime.placement import SHARED_SAMPLER_FRACTION, place, sampler_memory_fraction
from grpo.trainer.launch import failed_ranks, single_rank_env, torchrun_argv
from tests.conftest import PYTHON, REPO

DEMO = str(REPO / "configs" / "cpu_demo.yaml")
GRPO_COMMAND = Path(PYTHON).parent / "grpo"  # scripts/setup.sh installs the package


def test_trainer_command_is_the_same_on_cpu_and_gpu():
    """launch.sh has one trainer command (no device branch), and what it runs depends on the
    config alone."""
    script = (REPO / "launch.sh").read_text()
    assert script.count("grpo.trainer.launch") == 1 and "deepspeed.launcher" not in script
    args = [DEMO, "train.lr=1e-5", "train.num_ranks=2", "--resume"]
    argv = torchrun_argv(load_config(DEMO, args[1:]), args)
    assert argv == ["--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "2",
                    "--master_addr", "127.0.0.1", "--master_port", "29500",
                    "training_worker.py", *args]  # fmt: skip
    # One rank on one node runs without torchrun, with the variables torchrun would set but
    # the rendezvous port: it needs none (test_a_world_of_one_needs_no_free_port).
    assert single_rank_env(load_config(DEMO, ["train.num_ranks=2"])) is None
    assert single_rank_env(load_config(DEMO, ["train.num_ranks=1", "train.nnodes=2"])) is None
    assert single_rank_env(load_config(DEMO, ["train.num_ranks=1"])) == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
    }  # fmt: skip


def test_trainer_over_nodes_in_the_command_line():
    cfg = load_config(DEMO, ["train.nnodes=2", "train.node_rank=1", "train.master_addr=10.0.0.1",
                             "train.num_ranks=2"])  # fmt: skip
    argv = torchrun_argv(cfg, [DEMO])
    assert argv[:8] == ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2",
                        "--master_addr", "10.0.0.1"]  # fmt: skip
    assert cfg.world == 4


@pytest.mark.parametrize(
    "argv",
    [
        ["--local_rank=3", "c.yaml", "train.lr=1"],
        ["--local-rank", "3", "c.yaml", "train.lr=1"],
        ["c.yaml", "--local_rank=0", "train.lr=1"],
        ["c.yaml", "train.lr=1"],
    ],
)
def test_workers_ignore_a_launchers_local_rank(argv):
    """The DeepSpeed launcher's `--local_rank=N` in front of the config was the first GPU
    failure ("config file not found: --local_rank=0")."""
    assert without_launcher_args(argv) == ["c.yaml", "train.lr=1"]


def test_worker_started_the_deepspeed_launcher_way_reads_its_config():
    done = subprocess.run([PYTHON, "training_worker.py", "--local_rank=0", "--help-keys"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "num_ranks" in done.stdout, done.stderr


# ----------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("visible", "role", "ranks", "tp", "want_trainer", "want_sampler", "shared"),
    [
        (0, "both", 2, 1, (), (), False),  # CPU node: no GPUs for anyone
        (1, "both", 1, 1, (0,), (0,), True),  # one GPU: shared
        (2, "both", 1, 1, (0,), (1,), False),
        (8, "both", 4, 4, (0, 1, 2, 3), (4, 5, 6, 7), False),  # vLLM TP over the other four
        (8, "both", 7, 1, tuple(range(7)), (7,), False),
        (8, "both", 8, 1, tuple(range(8)), (0,), True),  # all for training: sampler shares
        (8, "trainer", 8, 1, tuple(range(8)), (), False),  # trainer node of a two-node run
        (8, "sampler", 8, 2, (), tuple(range(8)), False),  # sampler node
    ],
)
def test_automatic_placement(visible, role, ranks, tp, want_trainer, want_sampler, shared):
    p = place(visible, role, ranks, tp, [], [])
    assert (p.trainer, p.sampler, p.shared) == (want_trainer, want_sampler, shared)


def test_explicit_placement_and_its_errors():
    p = place(4, "both", 2, 1, [2, 3], [0])
    assert (p.trainer, p.sampler, p.shared) == ((2, 3), (0,), False)
    with pytest.raises(ConfigError, match=r"train.gpus=\[4\]: only 4 GPU\(s\) are visible"):
        place(4, "both", 1, 1, [4], [])
    with pytest.raises(ConfigError, match="train.num_ranks=4 needs one GPU per rank, 2 visible"):
        place(2, "both", 4, 1, [], [])
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 needs that many GPUs"):
        place(4, "both", 2, 2, [], [3])


def test_sampler_memory_cap(monkeypatch):
    cfg = load_config(DEMO)
    monkeypatch.delenv("GRPO_SHARED_GPU", raising=False)
    assert sampler_memory_fraction(cfg) == 0.0
    monkeypatch.setenv("GRPO_SHARED_GPU", "1")
    assert sampler_memory_fraction(cfg) == SHARED_SAMPLER_FRACTION
    assert sampler_memory_fraction(load_config(DEMO, ["rollout.gpu_memory_fraction=0.2"])) == 0.2


def test_placement_command_for_launch_sh(monkeypatch, capsys):
    """What launch.sh evals; on this CPU machine no role gets a GPU. The command as launch.sh
    runs it once; then its function in this process (a Python start-up with torch less)."""
    from grpo.cli import launch_env

    env = {**os.environ, "ROLE": "both"}
    done = subprocess.run([PYTHON, "-m", "grpo", "launch-env", DEMO], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TRAINER_GPUS=", "SAMPLER_GPUS=", "SHARED=0",
                                   "MODEL_PATH=embedded", f"RUN_DIR={REPO}/checkpoints/cpu_demo",
                                   "REWARD_SERVICE=0"]  # fmt: skip
    monkeypatch.setenv("ROLE", "both")
    assert launch_env([DEMO, "name=a b's run"]) == 0
    odd = capsys.readouterr().out
    shell = subprocess.run(["bash", "-c", odd + 'printf %s "$RUN_DIR"'],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    # absolute, for the summary a user reads from any directory; quoted for launch.sh's eval
    assert shell.stdout == str(Path("checkpoints", "a b's run").resolve())
    assert launch_env([DEMO, "train.gpus=[0, 1]"]) == 2
    assert "train.gpus lists 2 GPUs" in capsys.readouterr().err


def test_a_world_of_one_needs_no_free_port():
    """The single rank's process group and DeepSpeed's start while another program listens on
    the configured master port (a port picked free before the launch can be taken by then)."""
    script = """
import os, socket, sys
from datetime import timedelta
import torch, torch.distributed as dist
from grpo.trainer.process import join_trainer_world, without_deepspeed_shm_op
taken = socket.create_server(("127.0.0.1", 0))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(taken.getsockname()[1]),
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
without_deepspeed_shm_op()
join_trainer_world("gloo", timedelta(seconds=30))
x = torch.ones(3)
dist.all_reduce(x)
print("world", dist.get_world_size(), x.tolist())
"""
    proc = subprocess.run([PYTHON, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world 1 [1.0, 1.0, 1.0]" in proc.stdout


FAKE_PYTHON = """#!/usr/bin/env bash
# The roles' processes stand-ins: the sampler exits with $FAKE_SAMPLER_CODE at once (noting each
# start), the trainer waits to be stopped; anything else (launch-env) is the real Python.
case " $* " in
  *" sampling_worker.py "*) echo "start $GRPO_RESTARTS left $GRPO_RESTARTS_LEFT" >> "$STARTS"
                           echo "$*" >> "$STARTS.args"
                           exit "$FAKE_SAMPLER_CODE" ;;
  *" grpo.trainer.launch "*) exec sleep 60 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize(("code", "starts"), [(1, 3), (2, 1)])
def test_launch_sh_restarts_a_dying_role_a_bounded_number_of_times(tmp_path, code, starts):
    """launch.sh's supervision alone (the roles' processes are stand-ins; the healed real run
    is tests/test_chaos.py): a sampler that keeps dying is restarted GRPO_MAX_RESTARTS times,
    each start told its restarts so far and left, then the run stops naming it; a usage or
    config error (exit code 2) is not restarted: it would only fail again."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "REAL_PYTHON": PYTHON,
           "STARTS": str(tmp_path / "s"), "FAKE_SAMPLER_CODE": str(code),
           "GRPO_MAX_RESTARTS": "2", "GRPO_RESTART_DELAY_S": "0"}  # fmt: skip
    (tmp_path / "model").mkdir()
    for name in ("config.json", "tokenizer.json", "chat_template.jinja"):  # what the check reads
        (tmp_path / "model" / name).write_text("{}")
    proc = subprocess.run(["bash", str(REPO / "launch.sh"), DEMO, f"model.path={tmp_path}/model"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == code, proc.stderr
    started = (tmp_path / "s").read_text().splitlines()
    assert started == [f"start {n} left {2 - n}" for n in range(starts)], started
    # each restart goes on from where the run was, the first start as the user asked
    resumed = ["train.resume=auto" in line.split() for line in
               (tmp_path / "s.args").read_text().splitlines()]  # fmt: skip
    assert resumed == [n > 0 for n in range(starts)], resumed
    why = "its 2 restarts used up" if code == 1 else "a usage or config error"
    assert f"launch.sh: the sampler exited with code {code} ({why}); stopping" in proc.stderr


def test_launch_sh_doubles_the_restart_delay_at_each_restart(tmp_path):
    """GRPO_RESTART_DELAY_S is the first backoff; each restart of a role waits twice the one
    before (1 s, then 2 s here: every other test sets the delay to 0, so nothing saw it)."""
    command, env = fake_roles(tmp_path, 1, GRPO_MAX_RESTARTS="2", GRPO_RESTART_DELAY_S="1")
    began = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr
    said = re.findall(r"restarting it in (\d+) s \(restart (\d) of 2\)", proc.stderr)
    assert said == [("1", "1"), ("2", "2")], proc.stderr
    assert took >= 3.0, took


def fake_roles(tmp_path: Path, code: int, **env: str) -> tuple[list[str], dict[str, str]]:
    """launch.sh's command and environment with FAKE_PYTHON's stand-in roles."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "model").mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer.json", "chat_template.jinja"):  # what the check reads
        (tmp_path / "model" / name).write_text("{}")
    env = {**os.environ, "PYTHON": str(fake), "REAL_PYTHON": PYTHON,
           "STARTS": str(tmp_path / "s"), "FAKE_SAMPLER_CODE": str(code), **env}  # fmt: skip
    return ["bash", str(REPO / "launch.sh"), DEMO, f"model.path={tmp_path}/model"], env


@pytest.mark.parametrize("knob, value", [("GRPO_RESTART_DELAY_S", "5s"),
                                         ("GRPO_MAX_RESTARTS", "-1")])  # fmt: skip
def test_launch_sh_refuses_a_restart_setting_that_is_not_a_number(tmp_path, knob, value):
    """Issue 62: GRPO_RESTART_DELAY_S=5s was bash arithmetic's 0 and a "run complete" exit 0;
    now one line and exit 2, before any role starts."""
    command, env = fake_roles(tmp_path, 1, **{knob: value})
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"launch.sh: {knob} must be a whole number (0 to 999999), " \
        f"got '{value}'"  # fmt: skip
    assert not (tmp_path / "s").exists()  # nothing started


def test_sigterm_ends_a_restart_backoff_at_once(tmp_path):
    """Issue 62: a SIGTERM while launch.sh waits out a restart's backoff (here 60 s) stops the
    run at once, not once the backoff is over."""
    command, env = fake_roles(tmp_path, 1, GRPO_RESTART_DELAY_S="60")
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        while not seen or "restarting it in 60 s" not in seen[-1]:
            seen.append(proc.stderr.readline())
            assert seen[-1], seen  # launch.sh ended, or closed its stderr, first
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 130
        assert time.monotonic() - began < 40  # stop_all's bound is 30 s; the backoff is 60
    finally:
        proc.kill()


def test_help_exits_0_and_a_bad_reward_is_refused_before_any_model_loads():
    """Asking for help is no error; a reward that does not import, or cannot take grpo's call,
    is one line and exit 2 from the check launch.sh makes before any role starts (it was found
    at the sampler's first batch, after the models had loaded)."""
    helps = (["bash", str(REPO / "launch.sh"), "--help"], [PYTHON, "-m", "grpo", "--help"],
             [str(GRPO_COMMAND), "--help"], [str(GRPO_COMMAND), "launch", "--help"])  # fmt: skip
    for command in helps:  # from outside the checkout: the package is installed
        done = subprocess.run(command, cwd="/", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "launch" in done.stdout, done.stderr
    for reward, says in (("tests.rewards_for_tests:takes_one_argument", "takes (completion)"),
                         ("no_such_module_xyz:fn", "could not import reward module")):  # fmt: skip
        check = [PYTHON, "-m", "grpo", "check", DEMO, f"data.reward={reward}"]
        done = subprocess.run(check, cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith("config error: data.reward: ") and says in lines[0], lines
    # A trainer's node need not hold the reward's module: only the sampler imports it.
    trainer_only = [PYTHON, "-m", "grpo", "launch-env", DEMO, "data.reward=no_such_module_xyz:fn"]
    done = subprocess.run(trainer_only, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ROLE": "trainer"})  # fmt: skip
    assert done.returncode == 0, done.stderr


QUICK_ROLES = """#!/usr/bin/env bash
# Both roles' processes end at once, having noted where they run; launch-env is the real Python.
case " $* " in
  *" sampling_worker.py "*|*" grpo.trainer.launch "*) echo "$PWD $GRPO_USER_DIR" >> "$STARTS"
                                                       exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize(
    "command",
    [["bash", str(REPO / "launch.sh")], [str(GRPO_COMMAND), "launch"]],
    ids=["launch.sh", "grpo"],
)
def test_a_run_started_from_a_project_dir_finds_its_files_there(tmp_path, command):
    """launch.sh runs the roles from the repository, yet a config's relative paths (the data,
    the model dir) and a reward module in the directory the user started from are found there,
    before any role starts (they were looked for in the repository only). The installed
    `grpo launch` is launch.sh, from anywhere."""
    assert GRPO_COMMAND.is_file(), "no grpo command: bash scripts/setup.sh installs the package"
    project = tmp_path / "project"
    (project / "model").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "chat_template.jinja"):  # what the check reads
        (project / "model" / name).write_text("{}")
    (project / "mine.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    (project / "my_reward_xyz.py").write_text(
        "def reward(completion, row):\n    return float('#### 2' in completion)\n"
    )
    fake = tmp_path / "python"
    fake.write_text(QUICK_ROLES)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GRPO_USER_DIR"}
    env.update(PYTHON=str(fake), REAL_PYTHON=PYTHON, STARTS=str(tmp_path / "s"))
    overrides = [
        "model.path=model",
        "data.task=gsm8k",
        "data.train=mine.jsonl",
        "data.reward=my_reward_xyz:reward",
    ]
    proc = subprocess.run([*command, DEMO, *overrides], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = (tmp_path / "s").read_text().splitlines()
    assert runs == [f"{REPO} {project}"] * 2, runs  # the roles run in the repository, told


def test_a_rank_s_input_error_stays_exit_2_and_is_said_once():
    """Issue 64, item 1: torchrun turned a rank's 2 into 1, which launch.sh restarted three
    times. A 2 of any rank is the node's 2, and the line each rank left is said once; other
    failures are 1, named by rank."""
    failure = namedtuple("failure", "exitcode message")
    line = "trainer: ValueError: --resume: no complete training state in runs/x/state"
    assert failed_ranks({0: failure(2, line), 1: failure(2, line)}) == (2, line)
    assert failed_ranks({0: failure(-15, "Signal 15"), 1: failure(2, line)}) == (2, line)
    unsaid = failure(
        2, "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    )
    assert failed_ranks({0: unsaid}) == (2, "trainer: a rank could not start (exit 2)")
    assert failed_ranks({1: failure(-9, ""), 0: failure(1, "")}) == (
        1, "trainer: rank 0 exit 1, rank 1 killed by signal 9 (the rank's lines above say why)"
    )  # fmt: skip


@pytest.mark.slow
def test_an_input_error_on_two_ranks_is_one_line_exit_2_and_never_restarted(
    tmp_path, tiny_model_dir
):
    """Issue 64, item 1: the demo's shape of trainer (two ranks under torchrun) whose input is
    wrong exits 2 with the cause said once; torchrun made it 1, which launch.sh restarted three
    times: 95-105 s, about 190 lines, exit 1, four rotated run dirs. launch.sh's up-front check
    finds this input (a LoRA target module the model lacks) before torchrun starts, so the
    trainer's launcher is run as launch.sh runs it, alone: each rank's own start finds it
    (and an input only a rank can find takes the same way, `told_torchrun`); launch.sh never
    restarts a 2 (the stand-in roles' test above)."""
    from tests.test_integration import tiny_config

    config = tiny_config(tmp_path, tiny_model_dir)  # train.num_ranks 2
    lora = ["model.lora.enabled=true", "model.lora.target_modules=[q_prj]"]
    command = [PYTHON, "-m", "grpo.trainer.launch", str(config), *lora]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "q_prj" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert said[0].startswith("trainer: config error: model.lora.target_modules: q_prj match no"), (
        said
    )
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == said, proc.stderr  # the rank torchrun stopped: quiet


def test_a_trainer_stopped_while_it_starts_leaves_the_why_to_who_stopped_it(caplog):
    """The rank torchrun stops after another rank's input error, or a trainer launch.sh stops
    while it starts, adds no "interrupted" line to the one that says why (issue 64, item 1);
    a trainer stopped while it works still says it was."""
    from grpo.runtime.progress import ACTIVITY, STARTING, TRAINING
    from grpo.trainer.process import _interrupted

    try:
        with caplog.at_level(logging.INFO, logger="grpo.trainer"):
            ACTIVITY.enter(STARTING, "")
            assert _interrupted() == 130 and not caplog.records
            ACTIVITY.enter(TRAINING, "step 3")
            assert _interrupted() == 130
        assert [r.getMessage() for r in caplog.records] == ["trainer stopping: interrupted"]
    finally:
        ACTIVITY.enter(STARTING, "")


@pytest.mark.parametrize("worked, code", [(False, 2), (True, 1)], ids=["starting", "working"])
def test_a_role_s_error_is_a_config_error_only_while_it_starts(
    tmp_path, tiny_model_dir, monkeypatch, worked, code
):
    """Issue 62 (low): every ValueError a role raised exited 2, which launch.sh reads as a
    usage or config error and never heals. Only one raised while the role is still starting
    (bad data, model, reward: a restart fails the same way) is 2; once it worked, 1, which
    launch.sh heals by a restart from the last saved state."""
    import grpo.cli
    import grpo.sampler.loop
    from grpo.runtime.progress import ACTIVITY, GENERATING, STARTING
    from tests.test_integration import tiny_config

    def run_sampler(cfg) -> int:
        if worked:
            ACTIVITY.enter(GENERATING, "batch 3")
        raise ValueError("a row the reward cannot read")

    monkeypatch.setattr(grpo.cli, "setup_logging", lambda role: None)
    monkeypatch.setattr(grpo.sampler.loop, "run_sampler", run_sampler)
    config = tiny_config(tmp_path, tiny_model_dir)
    ACTIVITY.enter(STARTING, "")  # as in a new process (other tests in this one moved it)
    try:
        assert grpo.cli.main("sampler", [str(config)]) == code
    finally:
        ACTIVITY.enter(STARTING, "")


FAKE_STOPPED_BY_ITS_INPUT = """#!/usr/bin/env bash
# The trainer ends at once with 1 (its last sampler stopped: no sampler left); the sampler,
# slower to shut down, with 2 a moment later (its reward failed past reward.max_error_rate).
case " $* " in
  *" grpo.trainer.launch "*) echo trainer >> "$STARTS"; exit 1 ;;
  *" sampling_worker.py "*) echo sampler >> "$STARTS"; sleep 2; exit 2 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def test_an_input_error_during_a_restart_s_backoff_stops_the_run_unrestarted(tmp_path):
    """A sampler stopped by its failing reward told the trainer, which ended first (exit 1,
    no sampler left) and was restarted after its backoff; then the sampler's exit 2 stopped the
    run (issue 64's mistake table: a 1-step run of a broken reward restarted its trainer). The
    roles are waited for during a backoff too: an exit 2 there stops the run at once, and the
    role in its backoff is not started again."""
    command, env = fake_roles(tmp_path, 0, GRPO_RESTART_DELAY_S="20")
    (tmp_path / "python").write_text(FAKE_STOPPED_BY_ITS_INPUT)
    began = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 2, proc.stderr
    assert "the trainer exited with code 1; restarting it in 20 s" in proc.stderr
    assert "the trainer's restart called off (the sampler exited with code 2)" in proc.stderr
    assert "the sampler exited with code 2 (a usage or config error); stopping" in proc.stderr
    assert sorted((tmp_path / "s").read_text().split()) == ["sampler", "trainer"]  # once each
    assert took < 15, took  # not the 20 s backoff
