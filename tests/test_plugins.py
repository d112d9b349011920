"""A newcomer's policy loss and task, each one file outside grpo/ (tests/plugins/), selected by
`package.module:name` in the config with nothing in grpo/ naming them, and a run with them and
the toy rollout engine (whose own tests are tests/test_rollout_plugin.py), scored by a reward
model that launch.sh serves (the service's own tests are tests/test_reward_service.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from grpo.algos import policy_loss
from grpo.config import load_config
from grpo.models.loading import load_tokenizer
from grpo.plan import check_names
from grpo.tasks import get_task
from grpo.tasks.encoding import encode_prompt
from tests.conftest import free_port, run_launch, transport_overrides
from tests.plugins import toy_task
from tests.test_integration import _assert_no_stray_processes, tiny_config

LOSS, TASK = "tests.plugins.toy_loss:reinforce", "tests.plugins.toy_task:TASK"
ENGINE = "tests.plugins.toy_engine:build"


def test_toy_loss_by_hand():
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    logp = torch.tensor([[-0.5, -1.0, 0.0]])
    adv = torch.tensor([[1.0, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = policy_loss(LOSS, old, logp, adv, mask, agg="token-mean")
    assert float(loss) == pytest.approx((0.5 - 2.0) / 2)  # mean of -A * logp over 2 tokens
    assert float(metrics["approx_kl"]) == pytest.approx((-0.5 - 1.0) / 2)
    assert float(metrics["reinforce_logp"]) == pytest.approx((-0.5 - 1.0) / 2)  # its own


def test_toy_task_is_found_and_scores():
    task = get_task(TASK)
    assert task is toy_task.TASK and len(task.load(task.default_train)) == 64
    assert task.reward("it is 7", {"answer": "7"})[0] == 1.0
    assert task.reward("it is 8", {"answer": "7"})[0] == pytest.approx(-0.007)  # 7 characters
    check_names(load_config(None, [f"algo.loss={LOSS}", f"data.task={TASK}"]))  # no error


def test_the_run_s_plan_and_reward_are_the_plugins():
    """What a run builds from the config (grpo.plan.plan_loss, grpo.tasks.run_reward) is the
    toy loss and the toy task's reward, not a built-in one: the loss leaves its own metric,
    the reward scores below 0, where no built-in task's go."""
    from grpo.plan import plan_loss
    from grpo.tasks import run_reward

    plan = plan_loss(load_config(None, [f"algo.loss={LOSS}", f"data.task={TASK}"]))
    t = torch.tensor([[-1.0, -2.0]])
    _, metrics = plan.fn(t, t * 0.5, t, torch.ones_like(t), agg="token-mean")
    assert "reinforce_logp" in metrics
    reward = run_reward(get_task(TASK), "")
    assert reward("it is 8", {"answer": "7"})[0] == pytest.approx(-0.007)


@pytest.mark.extended  # CI leaves it out; plugins and the service: unit tests
@pytest.mark.slow
def test_a_run_with_the_toy_plugins_and_a_served_reward_model(
    tmp_path, tiny_model_dir, classifier_dir
):
    """All three plugins in one run, its answers scored by the task's rule and by a reward model
    that launch.sh serves (reward_server.backend set: the service is a third process, stopped
    at the end). The engine and the served reward model had a run each before.

    What shows that the toy loss and task ran is what only they make: the loss's own metric,
    the task's prompts and its rule's rewards (below 0, where no built-in task's go). The toy
    engine's log-probs reach the trainer next to the old ones, which two passes over each
    batch make the trainer compute (grpo.config.passes). The sampler's reward is rule + 0.5 x
    model, each answer scored once by the service."""
    config = tiny_config(
        tmp_path, tiny_model_dir,
        train={"total_steps": 2, "num_ranks": 1, "ppo_epochs": 2},
        data={"task": TASK, "reward": ""},  # its loader, prompts and reward
        algo={"loss": LOSS}, rollout={"backend": ENGINE},
        reward={"service_addr": f"tcp://127.0.0.1:{free_port()}", "model_weight": 0.5},
        reward_server={"backend": "classifier", "model": str(classifier_dir)},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["clip_frac"] == 0.0 and "loss" in r for r in rows)  # REINFORCE: no clip
    assert all(r["reinforce_logp"] < 0 for r in rows)  # the toy loss's own metric
    # The toy task's prompts ("Repeat the number N.") and its rule's rewards: the toy engine's
    # answers (tokens drawn at random) never repeat the number, so each answer costs a
    # thousandth per character.
    cfg = load_config(config)
    tok = load_tokenizer(tiny_model_dir)
    task = toy_task.TASK
    lengths = {len(encode_prompt(task, row, tok, cfg.data.system_prompt))
               for row in task.load(task.default_train)}  # fmt: skip
    assert all(set(r["prompt_lens"]) <= lengths for r in rows), (lengths, rows)
    assert all(-0.2 < r["rule_reward_mean"] < 0 and r["reward_std"] > 0 for r in rows), rows
    assert all(r["grad_norm"] > 0 for r in rows)  # and they trained the policy
    # The engine's log-probs reached the trainer next to the old ones; it reloaded version 1.
    assert all("rollout_vs_old_logp_abs_diff" in r for r in rows), rows[0].keys()
    assert "reloaded weights: version 0 -> 1" in log
    # The served reward model's part, each answer scored once, and the service stopped.
    for r in rows:
        combined = r["rule_reward_mean"] + 0.5 * r["model_reward_mean"]
        assert r["reward_mean"] == pytest.approx(combined, abs=1e-6)
        assert r["reward_errors"] == 0
    served = re.search(r"reward service stopping: (\d+) requests, (\d+) answers scored", log)
    assert served, log[-3000:]
    assert int(served.group(2)) == 2 * 16  # each answer once: 2 batches of 4 x 4
    _assert_no_stray_processes(config)
