"""The real pipeline: launch.sh starts the sampler and a DeepSpeed trainer (gloo) on 127.0.0.1
with a tiny random model; real ZeroMQ sockets, real checkpoints, real reloads. The trainer has 2
ranks unless a test is about something else: each rank costs seconds of start-up on CPU."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from bench.common import start_role
from tests.conftest import PYTHON, REPO, run_launch, transport_overrides

pytestmark = pytest.mark.slow


def tiny_config(tmp_path: Path, model_dir: Path, **sections) -> Path:
    cfg = {
        "name": "tiny",
        "output_dir": str(tmp_path / "runs"),
        "model": {"path": str(model_dir)},
        "data": {"reward": "tests.rewards_for_tests:text_length", "max_prompt_tokens": 256},
        "rollout": {"questions_per_step": 4, "group_size": 4, "max_new_tokens": 12},
        "train": {
            "total_steps": 3,
            "lr": 1.0e-3,
            "micro_batch_size": 4,
            "num_ranks": 2,
            "sync_interval": 1,
            # Synchronous, so the tests can name the reloads (0 -> 1 -> 2); the default
            # overlap has a test of its own.
            "max_staleness": 0,
        },
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# The reward of the reference run: a random model's answers are "right" about half the time,
# so pass@k has things to count.
REFERENCE_DATA = {"reward": "tests.rewards_for_tests:even_length_is_correct"}
# The tests that share the reference run: one xdist group, so that its module fixture runs once.
REFERENCE_GROUP = "reference_run"


@dataclass(frozen=True)
class Run:
    run_dir: Path
    log: str
    rows: list[dict]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, tiny_model_dir) -> Run:
    """A run with every output: 3 steps on 2 ranks, padded micro-batches of 4 (what auto picks
    with sdpa; the packing test compares other splits with it), the state saved every step and
    the ranks' evaluations (greedy and pass@k, each rank with half the questions)."""
    tmp = tmp_path_factory.mktemp("reference")
    config = tiny_config(
        tmp, tiny_model_dir, data=REFERENCE_DATA,
        train={"state_interval": 1, "packing": "padded"},
        eval={"interval": 2, "num_questions": 6, "max_new_tokens": 8, "samples": 4,
              "k": [1, 2, 4]},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    run_dir = tmp / "runs" / "tiny"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return Run(run_dir, log, rows)


@pytest.mark.xdist_group(REFERENCE_GROUP)
def test_three_steps_two_ranks_with_reloads(reference_run, tiny_model_dir):
    """The reference run's outputs: reloads, metrics, versions, state, evaluations,
    TensorBoard, and afterwards `python -m grpo eval` of its versions."""
    log, run_dir, rows = reference_run.log, reference_run.run_dir, reference_run.rows

    # Start-up says what it does (issue 64, item 4), and each step is one aligned line.
    assert re.search(r"\[trainer r0\] INFO trainer: loading the policy from \S+ into DeepSpeed "
                     r"\(2 rank\(s\)\)", log), log[:3000]  # fmt: skip
    steps = re.findall(r"INFO (step \d/3 \| +[\d.-]+ s \| ETA [\d:-]+ \| reward [\d.]+)", log)
    assert len(steps) == 3, log[-4000:]
    # The sampler reloaded the versions the trainer published before its next batch.
    reloads = re.findall(r"reloaded weights: version (\d+) -> (\d+)", log)
    assert ("0", "1") in reloads and ("1", "2") in reloads, log[-4000:]

    assert [r["step"] for r in rows] == [1, 2, 3]
    from tests.test_docs import undocumented_metrics

    missing = undocumented_metrics(set().union(*rows))
    assert not missing, f"docs/outputs.md does not name {missing}"
    # Answers to read: two per step (logging.samples_per_step), decoded, the question in the
    # prompt, the better first; and each evaluation's greedy answers to its first two questions.
    everything = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    samples = [s for s in everything if s["sampler_id"] != "eval"]
    assert [s["step"] for s in samples] == [1, 1, 2, 2, 3, 3]
    assert all("?" in s["prompt"] and isinstance(s["answer"], str) for s in everything)
    assert all(a["reward"] >= b["reward"] for a, b in zip(samples[::2], samples[1::2], strict=True))
    evaluated = [(s["version"], s["group_id"]) for s in everything if s["sampler_id"] == "eval"]
    assert evaluated == [(v, q) for v in (0, 2, 3) for q in (0, 1)], evaluated
    # On-policy (max_staleness 0): batch k was sampled with version k, and it said so.
    assert [r["policy_version"] for r in rows] == [0, 1, 2]
    assert [r["batch_seq"] for r in rows] == [0, 1, 2]
    assert all(r["staleness"] == 0 for r in rows)
    # On-policy with one optimizer step per batch: no old-policy pass (the training forward
    # gave the old log-probs), so no KL(old || ref) of the sampling policy either.
    assert all("rollout_kl_to_ref" not in r and r["clip_frac"] == 0 for r in rows)
    sent = re.findall(r"sent batch (\d+) \(version (\d+)\)", log)
    assert sent == [("0", "0"), ("1", "1"), ("2", "2")]
    assert "shm_comm" not in log  # DeepSpeed compiled no op at start-up (gloo does the work)

    # Each rank trained on whole, different groups.
    for r in rows:
        rank0, rank1 = r["rank_group_ids"]
        assert len(rank0) == len(rank1) == 2
        assert not set(rank0) & set(rank1)
        assert r["reward_std"] > 0  # the advantages were not all zero

    # Parameters changed, and the published version is a loadable HF dir.
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(run_dir / "versions" / "v000003" / "model.safetensors")
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert len(changed) >= len(before) // 2, changed
    assert (run_dir / "versions" / "v000003" / "config.json").is_file()
    assert (run_dir / "LATEST").read_text().strip() == "3"
    # The run's last version under a name that does not change: final -> versions/v000003.
    assert (run_dir / "final").resolve() == (run_dir / "versions" / "v000003").resolve()
    assert "final model: " in log and "python -m grpo samples" in log
    assert "rewards:     0 errors (0 of them timeouts) in 48 answers" in log  # 3 steps x 16
    marker = json.loads((run_dir / "train_state" / "COMPLETE").read_text())
    assert marker["tag"] == "step000003" and marker["world"] == 2
    assert [p.name for p in (run_dir / "train_state").glob("step*")] == ["step000003"]
    # Every batch was acknowledged: the sampler's spool is empty at the end.
    spool = run_dir.parent / "spool" / "tiny" / "sampler-0"
    assert sorted(p.name for p in spool.iterdir()) == ["state.json"]
    assert json.loads((spool / "state.json").read_text())["next_seq"] == 3
    assert (run_dir / "config.yaml").is_file() and (run_dir / "plot.png").is_file()
    assert not list(run_dir.rglob("*.tmp*"))
    _check_evaluations(run_dir, log)
    for key in (
        "loss",
        "kl",
        "clip_frac",
        "entropy",
        "accuracy",
        "format_rate",
        "response_len_mean",
        "sampler_gen_s",
        "train_s",
        "recv_s",
    ):
        assert key in rows[0]


def _check_evaluations(run_dir: Path, log: str) -> None:
    """The trainer's eval rows (first, every 2nd and last version), the same numbers in
    TensorBoard, and the eval CLI's greedy answers to v3 agreeing with the trainer's."""
    from tests.test_evaluation import _tensorboard_scalars

    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["version"] for e in evals] == [0, 2, 3], evals
    for e in evals:
        assert e["n"] == 6 and e["samples"] == 4
        assert 0 <= e["pass@1"] <= e["pass@2"] <= e["pass@4"] <= 1
    assert re.search(r"eval v3: accuracy [\d.]+, format [\d.]+ on 6 questions, pass@1", log)
    board = _tensorboard_scalars(run_dir)
    assert [s for s, _ in board["eval/pass@4"]] == [0, 2, 3]
    assert board["eval/accuracy"][-1] == (3, evals[-1]["accuracy"])
    assert [s for s, _ in board["train/reward_mean"]] == [1, 2, 3]
    assert "time/train_s" in board and "train/rank_group_ids" not in board

    done = subprocess.run(
        [PYTHON, "-m", "grpo", "eval", str(run_dir), "--versions", "0,3", "--samples", "2",
         "--show", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # --show 2: each version's greedy answers to its first two questions, the trainer's own
    # (its evaluation kept them in samples.jsonl)
    for v in (0, 3):
        shown = re.findall(rf"^== step {v}: .*, eval, group (\d+)\)$", done.stdout, re.M)
        assert shown == ["0", "1"], done.stdout
    kept = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    theirs = next(r for r in kept if r["sampler_id"] == "eval" and r["step"] == 3)
    assert f"-- answer:\n{theirs['answer']}\n" in done.stdout
    assert "| version | pass@1 (greedy) | format | degenerate | pass@1 | pass@2 | questions |" in (
        done.stdout
    )
    assert re.search(r"\nv0 -> v3: accuracy \d\.\d{3} -> \d\.\d{3} of \d+ questions, p = ",
                     done.stdout), done.stdout  # fmt: skip
    cli = [json.loads(x) for x in (run_dir / "eval_versions.jsonl").read_text().splitlines()]
    assert [r["version"] for r in cli] == [0, 3] and all(r["samples"] == 2 for r in cli)
    for mine, theirs in zip(cli, (evals[0], evals[-1]), strict=True):  # greedy: same answers
        assert (mine["accuracy"], mine["format_rate"]) == (
            theirs["accuracy"], theirs["format_rate"]
        ), (mine, theirs)  # fmt: skip
    # A version the run does not have: refused (in this process: a Python start-up less).
    from grpo.eval_cli import main as eval_main

    with contextlib.redirect_stderr(io.StringIO()) as err:
        assert eval_main([str(run_dir), "--versions", "5"]) == 2
    assert "has no versions [5]" in err.getvalue()


def test_what_a_run_opens_is_checked_before_any_role_starts(tmp_path, tiny_model_dir):
    """A missing DeepSpeed config, model dir, dataset or saved state (--resume) is one line and
    exit 2 from launch.sh's up-front check, in seconds, before any role starts (each was a
    traceback after the models had loaded: the trainer's, then the sampler stopped with it).
    A trainer that dies later is healed (tests/test_chaos.py)."""
    config = tiny_config(tmp_path, tiny_model_dir, train={"num_ranks": 1})
    for override, says in (
        ("train.deepspeed_config=nope.json", "train.deepspeed_config: no such file 'nope.json'"),
        ("model.path=/no/model", "model.path: '/no/model' is not an HF model dir"),
        ("data.train=./no/train.jsonl", "data.train: no such dataset file or directory"),
        ("--resume", "train.resume=always (--resume): no complete training state in"),
    ):
        started = time.monotonic()
        proc = run_launch(config, [*transport_overrides(), override], timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr
        assert "exited with code" not in proc.stderr and time.monotonic() - started < 30
    _assert_no_stray_processes(config)


def test_bad_config_key_via_launch(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path, tiny_model_dir)
    proc = run_launch(config, ["train.totl_steps=3"], timeout=60)
    assert proc.returncode == 2
    assert "unknown config key 'train.totl_steps'; did you mean 'train.total_steps'?" in (
        proc.stderr
    )


def start(role: str, config: Path, overrides: list[str], log: Path) -> subprocess.Popen:
    """launch.sh with ROLE=trainer | sampler (as on its own node) or both, output to `log`."""
    return start_role(role, config, overrides, log, env={"PYTHON": PYTHON})


def _assert_no_stray_processes(config: Path) -> None:
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(config) not in ps, ps


@pytest.mark.extended  # CI leaves it out; each part has unit tests
def test_overlap_dynamic_sampling_and_several_optimizer_steps_then_ctrl_c(tmp_path, tiny_model_dir):
    """One run, four features whose checks do not interfere (Ctrl-C had a run of its own
    before):

    - max_staleness 1 (the default): the sampler runs one batch ahead, sampling batch k with
      exactly version k - 1 however quick the trainer is, so the run repeats exactly;
    - dynamic sampling drops flat groups (every answer to an odd-length question scores the
      same);
    - one received batch, several optimizer steps: 2 epochs x 2 mini-batches of 8 sequences,
      with an entropy bonus and the dual clip;
    - SIGINT to launch.sh (what Ctrl-C sends) after step 4 ends sampler and trainer; exit
      code 130."""
    config = tiny_config(
        tmp_path, tiny_model_dir,
        data={"reward": "tests.rewards_for_tests:flat_on_odd_questions"},
        rollout={"dynamic_sampling": True, "max_sampling_rounds": 4},
        train={"total_steps": 50, "ppo_epochs": 2, "mini_batch_size": 8, "max_staleness": None},
        algo={"entropy_coef": 0.01, "clip_c": 3.0},
    )  # fmt: skip
    log, metrics = tmp_path / "launch.log", tmp_path / "runs/tiny/metrics.jsonl"
    launch = start("both", config, transport_overrides(), log)
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 4):
            assert time.monotonic() < deadline and launch.poll() is None, log.read_text()[-3000:]
            time.sleep(0.3)
        launch.send_signal(signal.SIGINT)
        # Up to 30 s of launch.sh's grace, then torchrun's own to its ranks: 90 s was once too
        # short with two test workers on 2 cores.
        launch.wait(timeout=180)
    finally:
        if launch.poll() is None:
            launch.kill()
    out = log.read_text()
    assert launch.returncode == 130, out[-3000:]
    assert "interrupted, stopping all roles" in out
    _assert_no_stray_processes(config)

    rows = [json.loads(x) for x in metrics.read_text().splitlines()][:4]
    assert [r["policy_version"] for r in rows] == [0, 0, 1, 2]
    assert [r["staleness"] for r in rows] == [0, 1, 1, 1]

    dropped = sum(r["sampler_flat_groups_dropped"] for r in rows)
    assert dropped > 0 and all(r["sampler_sampling_rounds"] >= 1 for r in rows)
    for r in rows:  # a flat group only stays when the rounds ran out
        assert r["sampler_flat_groups_kept"] == 0 or r["sampler_sampling_rounds"] == 4

    assert [r["optimizer_steps"] for r in rows] == [4] * 4
    # the first mini-batch of the first epoch is on-policy; later ones moved the weights
    assert rows[0]["approx_kl"] > 0 and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.extended  # CI leaves it out; packed forwards: test_logprobs.py
@pytest.mark.xdist_group(REFERENCE_GROUP)
def test_packing_token_budget_and_checkpointing_give_the_same_gradient(
    tmp_path, tiny_model_dir, reference_run
):
    """The reference run's first step (padded micro-batches of 4) on the same sampled batch two
    more ways: packed micro-batches filled to a token budget (a varying number per rank); padded
    ones filled to another budget, with gradient checkpointing. The loss and the gradient norm
    over all ranks must agree: only the padding, the split, or what backward recomputes
    changes. Each feature had a run of its own before; combined, they agree only if each does,
    and runs are what the suite's time goes to. (The variants' config is the reference's but
    for the steps and evaluation, which the trainer runs apart from the sampler's batches.)"""
    rows = {"padded": reference_run.rows[0]}
    variants = {
        "packed_budget": ["train.packing=packed", "train.max_tokens_per_micro_batch=200"],
        "padded_budget_checkpointed": ["train.packing=padded",
                                       "train.max_tokens_per_micro_batch=300",
                                       "model.gradient_checkpointing=true"],
    }  # fmt: skip
    for name, overrides in variants.items():
        (tmp_path / name).mkdir()
        config = tiny_config(
            tmp_path / name, tiny_model_dir, data=REFERENCE_DATA, train={"total_steps": 1}
        )
        proc = run_launch(config, [*transport_overrides(), *overrides], timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        text = (tmp_path / name / "runs/tiny/metrics.jsonl").read_text()
        rows[name] = json.loads(text.splitlines()[0])
    lens = rows["padded"]["completion_lens"]
    assert all(rows[n]["completion_lens"] == lens for n in rows)  # the same batch each time
    for name in variants:
        for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
            assert math.isclose(rows[name][key], rows["padded"][key], rel_tol=1e-3, abs_tol=1e-5), (
                name, key, rows[name][key], rows["padded"][key]
            )  # fmt: skip


@pytest.mark.extended  # CI leaves it out; LoRA, the critic: unit tests
def test_trainer_over_two_nodes_with_lora_and_a_critic_then_its_sampler_killed(
    tmp_path, tiny_model_dir
):
    """A trainer spanning two "nodes" (two ROLE=trainer launches, train.nnodes=2, one rank
    each, meeting at train.master_addr) and a sampler started on its own: the command lines
    of a multi-node run, on 127.0.0.1. After two steps the sampler is SIGKILLed: the trainer
    notices its silence and exits, on both nodes. One run, features whose checks do not
    interfere (the LoRA adapter, PPO's critic warm-up and the killed sampler had a run each
    before):

    - the policy is a LoRA adapter, published as one and reloaded by the sampler;
    - PPO (GAE, KL in the reward) whose critic warms up for the first step while the policy
      waits."""
    config = tiny_config(
        tmp_path, tiny_model_dir,
        train={"total_steps": 50, "num_ranks": 1},
        model={"lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj"]}},
        algo={"advantage": "gae", "lam": 0.9, "kl_in_reward": True},
        critic={"warmup_steps": 1},
    )  # fmt: skip
    common = [*transport_overrides(timeout_s=6), "train.nnodes=2", "train.master_addr=127.0.0.1"]
    logs = [tmp_path / f"{name}.log" for name in ("node0", "node1", "sampler")]
    roles = [
        start("trainer", config, [*common, "train.node_rank=0"], logs[0]),
        start("trainer", config, [*common, "train.node_rank=1"], logs[1]),
        start("sampler", config, common, logs[2]),
    ]
    run_dir = tmp_path / "runs" / "tiny"
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline, "no second step"
            assert all(p.poll() is None for p in roles), [p.poll() for p in roles]
            time.sleep(0.3)
        roles[2].kill()
        for p in roles[:2]:
            p.wait(timeout=120)
    finally:
        for p in roles:
            if p.poll() is None:
                p.kill()
    node0, node1, sampler = (log.read_text() for log in logs)
    assert roles[0].returncode != 0, node0[-3000:]
    assert "no sampler left: sampler sampler-0 dropped: silent for" in node0, node0[-3000:]
    _assert_no_stray_processes(config)  # node 1's rank went too
    assert "trainer: 2 rank(s)" in node0
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows[:2]] == [1, 2]
    for r in rows:  # node 0's rank and node 1's rank each trained two whole, different groups
        node0_groups, node1_groups = r["rank_group_ids"]
        assert len(node0_groups) == len(node1_groups) == 2
        assert not set(node0_groups) & set(node1_groups)

    # The policy waited: its metrics are left out of the row (not NaN), then it trained.
    assert not {"loss", "pg_loss", "kl", "grad_norm"} & rows[0].keys()
    assert math.isfinite(rows[1]["loss"])
    assert all(math.isfinite(r["vf_loss"]) for r in rows)  # the critic trained every step

    # The adapter, not the whole model, is published; the sampler reloaded it.
    assert "reloaded weights: version 0 -> 1" in sampler
    vdir = run_dir / "versions" / f"v{int((run_dir / 'LATEST').read_text()):06d}"
    assert not (vdir / "model.safetensors").exists()
    adapter = load_file(vdir / "adapter_model.safetensors")
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # B starts at 0: it was trained
