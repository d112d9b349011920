"""algo.rollout_correction: decoupled, AReaL's decoupled PPO objective: the clip against the
proximal policy (the old log-probs, computed before the update) and each token weighted by
pi_prox / pi_behav with its own behaviour log-prob (rollout_logp), 0 above the cap.

The reference below is AReaL's formula written out from the semantics of `ppo_actor_loss_fn`
in inclusionAI/AReaL @fbc966d9e4c443e1e3f717aa622c77052fea9dc9,
areal/utils/functional/functional.py (the same at @56bad8b21a7307fbe53c2c5ad8311a8aa21ffe45,
areal/utils/functional.py), token-level importance sampling. It is compared with the loss the
trainer computes through its own path: build_experience (the correction's weights) and
micro_batch_loss (the forward and the registered policy loss).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo.algos import rollout_correction_weights, rollout_rejection
from grpo.config import ConfigError, load_config
from grpo.core.episode import Episode, EpisodeBatch
from grpo.plan import plan_experience, plan_objective
from grpo.scoring.forward import pairs_logprobs
from grpo.trainer.experience import token_version_metrics
from grpo.trainer.step import micro_batch_loss
from tests.experience import build_experience
from tests.test_devices import StandInLM


def areal_decoupled_loss(
    logprobs: torch.Tensor,  # (B, T) the policy's now, with gradient
    proximal_logprobs: torch.Tensor,  # (B, T) the proximal policy's
    old_logprobs: torch.Tensor,  # (B, T) the behaviour policy's (AReaL's name for them)
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,  # (B, T) bool
    eps_clip: float,
    eps_clip_higher: float | None,
    c_clip: float | None,
    behav_imp_weight_cap: float | None,
) -> torch.Tensor:
    """AReaL's decoupled PPO policy loss, written from its semantics (see the module)."""
    count = loss_mask.count_nonzero() or 1
    ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + high)
    loss = torch.max(-advantages * ratio, -advantages * clipped)
    if c_clip is not None:
        loss = torch.min(loss, torch.sign(advantages) * c_clip * advantages)
    behav_imp_weight = (proximal_logprobs - old_logprobs).exp()
    kept = loss_mask
    if behav_imp_weight_cap is not None:
        kept = (behav_imp_weight <= behav_imp_weight_cap) & loss_mask
    behav_imp_weight = torch.where(kept, behav_imp_weight, 0.0)
    loss = loss * behav_imp_weight
    return torch.where(loss_mask, loss, 0).sum() / count


PROMPTS = [np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32)]
COMPLETIONS = [np.array([6, 7, 8, 9, 10], np.int32), np.array([11, 12, 13], np.int32)]
# log(pi_prox / pi_now) per token: the clip (0.2 / 0.28) and, for the answer of negative
# advantage, the dual clip (ratio e^1.5 > 3) are both reached
PROX_SHIFT = [[0.0, -0.3, 0.35, 0.1, -1.5], [0.05, -1.5, 0.4]]
# log(pi_prox / pi_behav) per token: e^0.9 = 2.46 and e^1.4 above the cap of 2, masked
BEHAV_SHIFT = [[0.1, -0.4, 0.9, 0.0, 0.3], [1.4, -0.2, 0.6]]
CAP = 2.0
CONFIG = [
    "rollout.backend=vllm", "algo.rollout_correction=decoupled",
    f"algo.rollout_correction_threshold={CAP}", "algo.kl_loss_coef=0", "algo.agg=token-mean",
    "algo.clip_low=0.2", "algo.clip_high=0.28", "algo.clip_c=3", "rollout.temperature=0.9",
]  # fmt: skip


def _model() -> StandInLM:
    torch.manual_seed(0)
    return StandInLM(torch.device("cpu"))


def _now(model, cfg, grad: bool = False) -> torch.Tensor:
    with torch.set_grad_enabled(grad):
        return pairs_logprobs(model, PROMPTS, COMPLETIONS, packed=False, pad_id=0,
                              temperature=cfg.rollout.temperature).logp  # fmt: skip


def _batch(model, cfg, behav_shift=BEHAV_SHIFT, versions=None) -> EpisodeBatch:
    now = _now(model, cfg)
    eps = []
    for i, c in enumerate(COMPLETIONS):
        prox = now[i, : len(c)].numpy() + np.array(PROX_SHIFT[i], np.float32)
        behav = prox - np.array(behav_shift[i], np.float32)
        eps.append(Episode(PROMPTS[i], c, prox, None, float(i == 0), {}, "stop", 0,
                           rollout_logp=behav.astype(np.float32),
                           token_versions=None if versions is None else versions[i]))  # fmt: skip
    return EpisodeBatch(eps, 2, 0 if versions is None else int(min(map(min, versions))), 0)


def _padded(rows: list[list[float]]) -> torch.Tensor:
    out = torch.zeros(len(rows), max(map(len, rows)))
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def test_the_trainer_s_loss_is_areal_s_decoupled_ppo():
    """Loss and gradients, through build_experience and micro_batch_loss, equal AReaL's
    formula on the same log-probs and advantages."""
    cfg = load_config(None, CONFIG)
    model = _model()
    batch = _batch(model, cfg)
    exp, metrics = build_experience(batch, plan_experience(cfg), 0.0)
    model.zero_grad()
    loss, _, step_metrics = micro_batch_loss(model, exp, plan_objective(cfg), 0)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    logp = _now(model, cfg, grad=True)
    mask = logp.new_zeros(logp.shape, dtype=torch.bool)
    for i, c in enumerate(COMPLETIONS):
        mask[i, : len(c)] = True
    prox = logp.detach() + _padded(PROX_SHIFT)
    behav = prox - _padded(BEHAV_SHIFT)
    adv = exp.advantages  # GRPO's, the estimator is not part of the loss: +-0.707 per answer
    assert adv[0, 0] > 0 > adv[1, 0]
    want = areal_decoupled_loss(logp, prox, behav, adv, mask, 0.2, 0.28, 3.0, CAP)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    for got, expected in zip(grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-7)
    # the case is not trivial: tokens masked by the cap, clipped, and dual-clipped
    assert metrics["correction_clipped_frac"] == pytest.approx(2 / 8)
    assert float(step_metrics["clip_frac"]) > 0 and float(step_metrics["dual_clip_frac"]) > 0
    # masked tokens stay in the token-mean's denominator (AReaL divides by the loss mask)
    assert exp.loss_mask.sum() == 8 and exp.is_weights[0, 2] == 0 and exp.is_weights[1, 0] == 0
    # without its cap the loss differs: the two masked tokens would count
    uncapped = areal_decoupled_loss(logp.detach(), prox, behav, adv, mask, 0.2, 0.28, 3.0, None)
    assert uncapped.item() != pytest.approx(want.item(), rel=1e-3)


def test_each_token_is_weighted_with_its_own_behaviour_log_prob():
    """One answer sampled across an update (its first three tokens by version 3, the last two
    by version 4): changing the behaviour log-probs of the later tokens changes their weights
    only; the loss stays AReaL's with the per-token behaviour log-probs. The trainer reads each
    token's behaviour log-prob as it comes, whatever its version: that the engine records the
    log-prob of the version that sampled the token is shown where it is made
    (tests/test_hf_continuous.py, a version changing mid-answer) and in a run
    (tests/test_continuous_runs.py, the engine's log-probs against the trainer's)."""
    cfg = load_config(None, CONFIG)
    model = _model()
    versions = [np.array([3, 3, 3, 4, 4], np.int32), np.array([4, 4, 4], np.int32)]
    later = [[*BEHAV_SHIFT[0][:3], -0.6, 0.5], BEHAV_SHIFT[1]]  # version 4's tokens resampled
    runs = []
    for shift in (BEHAV_SHIFT, later):
        exp, _ = build_experience(_batch(model, cfg, shift, versions), plan_experience(cfg), 0.0)
        loss, _, _ = micro_batch_loss(model, exp, plan_objective(cfg), 0)
        runs.append((exp, loss.item()))
        expected = torch.exp(_padded(shift)) * (torch.exp(_padded(shift)) <= CAP) * exp.mask
        assert torch.allclose(exp.is_weights, expected, atol=1e-6)
        logp = _now(model, cfg)
        prox = logp + _padded(PROX_SHIFT)
        want = areal_decoupled_loss(logp, prox, prox - _padded(shift), exp.advantages,
                                    exp.mask > 0, 0.2, 0.28, 3.0, CAP)  # fmt: skip
        assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    (first, loss_a), (second, loss_b) = runs
    changed = (first.is_weights != second.is_weights).nonzero().tolist()
    assert changed == [[0, 3], [0, 4]]  # the later version's tokens, and only those
    assert loss_a != pytest.approx(loss_b, rel=1e-4)
    assert first.token_versions[0].tolist() == [3, 3, 3, 4, 4]
    metrics = token_version_metrics(first.token_versions, first.mask, current=5)
    assert metrics["answers_multi_version_share"] == 0.5
    assert metrics["token_version_lag_max"] == 2.0


def test_decoupled_weights_by_hand_and_with_masks():
    """pi_prox / pi_behav kept up to the cap, 0 above it (not capped), no lower bound; masks
    compose by '+'; its zeros are weights, not rejections."""
    old = torch.log(torch.tensor([[0.1, 1.0, 2.0, 2.5], [4.0, 0.5, 1.0, 1.0]]))
    rollout = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    w, m = rollout_correction_weights(old, rollout, mask, "decoupled", 2.0)
    assert torch.allclose(w, torch.tensor([[0.1, 1.0, 2.0, 0.0], [0.0, 0.5, 1.0, 0.0]]))
    assert m["correction_clipped_frac"] == pytest.approx(2 / 7)
    assert m["correction_weight_mean"] == pytest.approx((0.1 + 1 + 2 + 0.5 + 1) / 7)
    bands = {"token_reject": (0.2, 3.0)}
    both, m2 = rollout_correction_weights(old, rollout, mask, "decoupled+token_reject", 2.0, bands)
    assert torch.allclose(both, w * torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 1]]))
    assert m2["correction_token_reject_token_frac"] == pytest.approx(2 / 7)
    assert torch.equal(rollout_rejection(old, rollout, mask, "decoupled", {}), torch.ones(2, 4))
    huge = rollout_correction_weights(old, rollout - 500.0, mask, "decoupled", 2.0)[0]
    assert torch.isfinite(huge).all() and (huge == 0).all()
    with pytest.raises(ValueError, match="threshold must be > 1"):
        rollout_correction_weights(old, rollout, mask, "decoupled", 1.0)


def test_the_config_accepts_decoupled_and_checks_its_cap():
    cfg = load_config(None, CONFIG[:3])
    assert cfg.algo.rollout_correction == "decoupled"
    load_config(None, [*CONFIG[:2], "algo.rollout_correction=decoupled+geo_rs"])
    with pytest.raises(ConfigError, match="rollout_correction_threshold must be > 1"):
        load_config(None, [*CONFIG[:2], "algo.rollout_correction_threshold=1"])
    with pytest.raises(ConfigError, match="twice"):
        load_config(None, ["rollout.backend=vllm", "algo.rollout_correction=decoupled+icepop"])
    assert math.isclose(cfg.algo.rollout_correction_threshold, CAP)
