"""The GPU check (`python -m bench.gpu_check`) run on CPU: every shipped config and the GPU
recipe through launch.sh, shrunk to the tiny model, with the table it prints."""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest

from bench import gpu_check
from grpo.config import load_config
from grpo.core.staleness import required_version
from tests.conftest import PYTHON, REPO, free_port

SHRINK = [
    "model.dtype=float32",
    "data.reward=tests.rewards_for_tests:text_length", "data.max_prompt_tokens=256",
    "rollout.questions_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
    "rollout.generation_batch_size=16", "train.micro_batch_size=4",
    "train.lr=1e-3", "train.mini_batch_size=8", "critic.warmup_steps=0",
]  # fmt: skip


# Shipped configs that differ from gsm8k_grpo only in their advantage estimator (with its
# aggregation and KL coefficient): on CPU their launch would run gsm8k_grpo's machinery again
# (their estimators are unit-tested against verl's), so here they are checked up front only,
# and that they differ in nothing else. The GPU check itself launches every one.
ESTIMATOR_VARIANTS = ["gsm8k_dr_grpo", "gsm8k_reinforce_pp", "gsm8k_rloo"]
LAUNCHED = [c for c in gpu_check.shipped_configs() if c not in ESTIMATOR_VARIANTS]


@pytest.mark.parametrize("config", ESTIMATOR_VARIANTS)
def test_an_estimator_variant_differs_from_grpo_in_its_estimator_alone(config):
    from dataclasses import replace

    from grpo.plan import plan_run

    ours = load_config(REPO / "configs" / f"{config}.yaml")
    grpo = load_config(REPO / "configs" / "gsm8k_grpo.yaml")
    assert ours.algo.advantage != grpo.algo.advantage
    assert replace(ours, name=grpo.name, algo=grpo.algo) == grpo  # else launch it below
    plan_run(ours)  # the launch's up-front check: every name resolves, the loss takes its options


# CI launches the recipe; the other configs, in the extended tier (tests/conftest.py), differ
# from it in their loss, reward or tools, each unit-tested (PPO's critic on two ranks: the
# ZeRO-3 test).
IN_CI = {gpu_check.RECIPE}


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=[] if c in IN_CI else [pytest.mark.extended])
     for c in [*LAUNCHED, gpu_check.RECIPE]],
)  # fmt: skip
def test_every_shipped_config_runs_through_the_gpu_check(tmp_path, tiny_model_dir, config):
    """Each config (one test each, so that xdist spreads them; the estimator variants above
    excepted) for 2 steps through the check's own code path, then what it must show in its
    metrics. The recipe runs on 2 trainer ranks;
    the other configs differ only in their loss and advantage, which every rank computes
    alike, so one rank (seconds less start-up). PPO's critic engine on 2 ranks is the two-node
    run's (test_integration.py) and, partitioned, the ZeRO-3 test's."""
    ranks = 2 if config == gpu_check.RECIPE else 1
    overrides = [f"model.path={tiny_model_dir}", *SHRINK, f"train.num_ranks={ranks}"]
    if "dapo" in config:  # DAPO's overlong buffer must fit the 12 tokens
        overrides.append("algo.overlong_buffer=4")
    if "calculator" in config:  # a random model never writes a call: a scripted engine does,
        # so masks with a tool's tokens in them cross the wire and reach the loss
        overrides += ["rollout.backend=tests.plugins.tool_engine:build",
                      "rollout.max_new_tokens=40"]  # fmt: skip
    if "judge" in config:  # the tiny model judges too, on a port of its own
        overrides += [f"reward_server.model={tiny_model_dir}", "reward_server.max_new_tokens=4",
                      f"reward.service_addr=tcp://127.0.0.1:{free_port()}"]  # fmt: skip
    (r,) = gpu_check.run([config], 2, False, overrides, tmp_path)
    table = gpu_check.table([r])
    assert r.config == config and r.exit_code == 0 and r.steps == 2, f"{config}:\n{r.log_tail}"
    assert r.s_per_step > 0 and r.gen_tokens_per_s > 0 and r.trainer_tokens_per_s > 0
    assert r.trainer_peak_gib > 0 and r.sampler_peak_gib > 0  # peak RSS on CPU
    assert f"| {config} | 0 | 2 |" in table
    metrics = gpu_check.read_rows(tmp_path / config / "metrics.jsonl")
    t = load_config(REPO / "configs" / f"{config}.yaml", overrides).train
    # the shipped configs overlap (the default) unless they say otherwise
    want = [required_version(k, t.max_staleness, t.sync_interval) for k in (0, 1)]
    assert [m["policy_version"] for m in metrics] == want
    assert all(math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics)
    assert all(m["policy_steps_skipped"] == 0 for m in metrics)
    if "calculator" in config:  # each group of 4: two calls, one refused (1/0), one answer
        # without a call (tests/plugins/tool_engine.py)
        assert all((m["turns_mean"], m["tool_calls_mean"], m["tool_errors_mean"])
                   == (1.75, 0.75, 0.25) for m in metrics), metrics[0]  # fmt: skip
        assert all(0 < m["tool_token_frac"] < 0.5 for m in metrics)  # the masks arrived
    else:
        assert "turns_mean" not in metrics[0] and "tool_token_frac" not in metrics[0]
    if "ppo" in config:  # the critic trained too, and KL was charged in the reward
        assert all(math.isfinite(m["vf_loss"]) and "vf_explained_var" in m for m in metrics)
        assert metrics[1]["kl_reward_coef"] != metrics[0]["kl_reward_coef"]  # adaptive
        assert all(m["critic_steps_skipped"] == 0 for m in metrics)


def test_summary_and_table_from_a_run_dir(tmp_path):
    now = time.time()
    rows = [
        {"time": now + 10 * k, "sampler_gen_tokens_per_s": 100.0 * k,
         "trainer_tokens_per_s": 1000.0, "trainer_peak_mem_gib": 1.0 + k,
         "sampler_peak_mem_gib": 0.5} for k in (1, 2, 3)
    ]  # fmt: skip
    evals = [{"version": v, "format_rate": f, "accuracy": a, "n": 128}
             for v, f, a in ((0, 0.39, 0.0), (25, 0.95, 0.04))]  # fmt: skip
    for name, items in (("metrics.jsonl", rows), ("eval.jsonl", evals)):
        (tmp_path / name).write_text("".join(json.dumps(x) + "\n" for x in items))
    r = gpu_check.summarise("gpu_smollm2", 0, 99.0, tmp_path, "")
    assert (r.steps, r.s_per_step, r.gen_tokens_per_s, r.trainer_peak_gib) == (3, 10.0, 200.0, 4.0)
    line = gpu_check.table([r]).splitlines()[-1]
    assert line == ("| gpu_smollm2 | 0 | 3 | 10.0 | 200 | 1,000 | 4.00 | 0.50 "
                    "| v0 0.39 / 0.000 / - -> v25 0.95 / 0.040 / - |")  # fmt: skip
    failed = gpu_check.summarise("gsm8k_grpo", 1, 5.0, tmp_path / "none", "boom")
    assert gpu_check.table([failed]).splitlines()[-1].startswith("| gsm8k_grpo | 1 | 0 | - |")


def test_unknown_config_is_refused():
    done = subprocess.run([PYTHON, "-m", "bench.gpu_check", "--only", "gsm8k_nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "no configs/gsm8k_nope.yaml" in done.stderr


def test_the_weights_broadcast_is_timed_and_every_byte_checked() -> None:
    """bench.broadcast on CPU (gloo between two processes; NCCL where a node has two GPUs):
    buckets sent from rank 0 arrive at rank 1 bit for bit in every repetition, each timed."""
    import torch

    from bench import broadcast
    from bench.gpu import TINY, _model
    from grpo.weights.stream.torch_bits import image_from_state

    sizes = broadcast.model_sizes(TINY, torch.float32)  # as the trainer's image lists them
    image = image_from_state(0, _model(TINY, torch.float32, torch.device("cpu")).state_dict(),
                             1 << 26, False)  # fmt: skip
    assert sizes == [s.nbytes for s in image.manifest.specs]
    assert sum(broadcast.buckets_of(sizes)) == sum(sizes)
    numbers = broadcast.broadcast_numbers([3 << 20, 12_345], reps=2, backend="gloo")
    assert numbers["backend"] == "gloo (2 host processes, 2 buckets)"
    assert numbers["GB"] == f"{((3 << 20) + 12_345) / 1e9:.3f}" and float(numbers["s/GB"]) > 0
