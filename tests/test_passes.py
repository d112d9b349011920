"""Less work per step: which scoring passes a config needs, and that a skipped old-policy pass
gives the same loss and gradients as the pass it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo.config import load_config
from grpo.config.passes import scored_by, scoring_passes
from grpo.core.episode import Episode, EpisodeBatch
from grpo.plan import plan_experience, plan_objective
from grpo.scoring.forward import pairs_logprobs
from grpo.trainer.step import micro_batch_loss
from tests.experience import build_experience
from tests.test_devices import COMPLETIONS, PROMPTS, StandInLM


@pytest.mark.parametrize(
    ("overrides", "old", "reference"),
    [
        ([], True, True),  # the default overlaps: batch k is sampled by version k - 1
        (["train.logprobs_on=trainer"], False, True),  # which defaults to on-policy
        (["train.max_staleness=0"], False, True),  # on-policy, one step per batch, KL loss
        (["train.max_staleness=0", "algo.kl_loss_coef=0"], False, False),  # no pass at all
        (["train.max_staleness=0", "algo.kl_loss_coef=0", "algo.kl_in_reward=true"], True, True),
        (["train.max_staleness=1", "train.logprobs_on=trainer"], False, True),
        (["train.max_staleness=0", "train.sync_interval=2"], True, True),  # weights moved
        (["train.max_staleness=0", "rollout.num_samplers=2", "train.total_steps=10"], True, True),
        (["train.max_staleness=0", "train.ppo_epochs=2"], True, True),  # 2nd pass: off-policy
        (["train.max_staleness=0", "train.mini_batch_size=8"], True, True),  # 2 steps of 8
        (["train.max_staleness=0", "train.mini_batch_size=16"], False, True),  # 1 step of 16
        (["train.max_staleness=0", "algo.rollout_correction=token_truncate",
          "rollout.backend=vllm"], True, True),
    ],
)  # fmt: skip
def test_passes_follow_the_config(overrides, old, reference):
    cfg = load_config(None, ["rollout.questions_per_step=4", "rollout.group_size=4", *overrides])
    passes = scoring_passes(cfg)
    assert (passes.old, passes.reference) == (old, reference)


def test_overlap_is_the_default_only_where_the_ratio_sees_the_lag():
    assert load_config(None, []).train.max_staleness == 1
    assert load_config(None, ["train.logprobs_on=trainer"]).train.max_staleness == 0
    explicit = ["train.logprobs_on=trainer", "train.max_staleness=2", "train.keep_versions=4"]
    assert load_config(None, explicit).train.max_staleness == 2


def test_each_role_scores_what_the_other_does_not():
    """(sampler's arrays, trainer's arrays): the sampler's are what the trainer admits."""
    expect = {
        ("train.max_staleness=0",): ({"ref_logp"}, set()),  # on-policy: no old-policy pass
        (): ({"old_logp", "ref_logp"}, set()),
        ("algo.kl_loss_coef=0",): ({"old_logp"}, set()),
        ("train.logprobs_on=trainer",): (set(), {"ref_logp"}),  # on-policy there by default
        ("train.logprobs_on=trainer", "train.ppo_epochs=2"): (set(), {"old_logp", "ref_logp"}),
    }
    for overrides, (sampler, trainer) in expect.items():
        cfg = load_config(None, list(overrides))
        assert (scored_by(cfg, "sampler"), scored_by(cfg, "trainer")) == (sampler, trainer)


def _batch(old: list | None) -> EpisodeBatch:
    episodes = tuple(
        Episode(PROMPTS[i], COMPLETIONS[i], None if old is None else old[i], None, float(i),
                {}, "stop", 0)
        for i in range(2)
    )  # fmt: skip
    return EpisodeBatch(episodes, group_size=2, policy_version=0, seq=0)


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
def test_skipped_old_pass_gives_the_same_loss_and_gradients(loss):
    """Old log-probs from a separate no-grad forward (the pass) against none (the training
    forward's own, detached): the same loss, metrics and gradients."""
    cfg = load_config(None, [f"algo.loss={loss}", "algo.kl_loss_coef=0"])
    torch.manual_seed(0)
    model = StandInLM(torch.device("cpu"))
    with torch.no_grad():
        out = pairs_logprobs(model, PROMPTS, COMPLETIONS, packed=False, pad_id=0,
                             temperature=cfg.rollout.temperature)  # fmt: skip
    scored = [out.logp[i, : len(c)].numpy() for i, c in enumerate(COMPLETIONS)]
    results = []
    for old in (scored, None):
        model.zero_grad()
        exp, _ = build_experience(_batch(old), plan_experience(cfg), kl_coef=0.0)
        assert (exp.old_logp is None) == (old is None) and exp.ref_logp is None
        loss_t, _, metrics = micro_batch_loss(model, exp, plan_objective(cfg), 0)
        loss_t.backward()
        results.append((loss_t.detach(), metrics, [p.grad.clone() for p in model.parameters()]))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    assert float(loss_a) != 0.0 and torch.allclose(loss_a, loss_b, atol=1e-7)
    assert "kl" not in metrics_a and metrics_a.keys() == metrics_b.keys()
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    assert float(metrics_b.get("clip_frac", 0.0)) == 0.0  # the ratio is exactly 1


def test_without_a_reference_there_is_no_kl_metric_but_a_loss():
    cfg = load_config(None, ["algo.kl_loss_coef=0"])
    exp, metrics = build_experience(_batch(None), plan_experience(cfg), kl_coef=0.0)
    assert "rollout_kl_to_ref" not in metrics
    loss_t, _, step_metrics = micro_batch_loss(
        StandInLM(torch.device("cpu")), exp, plan_objective(cfg), 0
    )
    assert torch.isfinite(loss_t) and "kl" not in step_metrics
    assert np.isfinite(float(step_metrics["entropy"]))


def test_the_objective_adds_its_kl_term_and_subtracts_its_entropy_bonus():
    """micro_batch_loss is the policy loss + kl_coef * KL(policy || reference) - entropy_coef *
    entropy, each aggregated as the loss is (token-mean here), with the plan's coefficients."""
    torch.manual_seed(0)
    model = StandInLM(torch.device("cpu"))
    ref = [np.full(len(c), -2.0, np.float32) for c in COMPLETIONS]
    episodes = tuple(Episode(PROMPTS[i], COMPLETIONS[i], None, ref[i], float(i), {}, "stop", 0)
                     for i in range(2))  # fmt: skip
    batch = EpisodeBatch(episodes, group_size=2, policy_version=0, seq=0)
    losses = {}
    for kl, entropy in ((0.0, 0.0), (0.5, 0.0), (0.0, 0.1)):
        cfg = load_config(None, [f"algo.kl_loss_coef={kl}", f"algo.entropy_coef={entropy}",
                                 "algo.agg=token-mean"])  # fmt: skip
        exp, _ = build_experience(batch, plan_experience(cfg), kl_coef=0.0)
        loss_t, _, metrics = micro_batch_loss(model, exp, plan_objective(cfg), 0)
        measured = (loss_t.detach(), metrics["kl"], metrics["entropy"])
        losses[kl, entropy] = [float(x) for x in measured]
    plain, kl_term, bonus = losses[0.0, 0.0], losses[0.5, 0.0], losses[0.0, 0.1]
    assert plain[1] > 0 and plain[2] > 0
    assert kl_term[0] - plain[0] == pytest.approx(0.5 * plain[1], rel=1e-5)
    assert bonus[0] - plain[0] == pytest.approx(-0.1 * plain[2], rel=1e-5)
