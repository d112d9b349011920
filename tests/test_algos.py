"""Hand-computed checks for grpo.algos (advantages, aggregation, KL, policy losses)."""

import inspect
import math

import pytest
import torch

from grpo.algos import (
    agg_loss,
    broadcast_to_tokens,
    get_advantage_estimator,
    get_policy_loss,
    group_advantages,
    kl_penalty,
    policy_loss,
    register_advantage_estimator,
    register_policy_loss,
)
from grpo.algos.registry import POLICY_LOSSES


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b), atol=tol)


# ---------------------------------------------------------------- aggregation

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 valid tokens
        ("seq-mean-token-sum", 3.5),  # mean(1 + 2, 4) = (3 + 4) / 2
        ("seq-mean-token-mean", 2.75),  # mean(3 / 2, 4 / 1) = (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # mean(3 / T, 4 / T), T = 3 -> (1 + 4/3) / 2
    ],
)
def test_agg_loss_modes(mode, expected):
    assert close(agg_loss(LOSS, MASK, mode), expected)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_agg_loss_empty_mask_is_zero_not_nan(mode):
    assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_agg_loss_unknown_mode_lists_valid():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(LOSS, MASK, "token-sum")


# ---------------------------------------------------------------- advantages


def test_group_advantages_grpo():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, 4)
    # group 1: mean 0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.5 / (0.57735 + 1e-6)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024
    assert close(adv, [a, -a, -a, a, 0, 0, 0, 0])
    # group 2 has identical rewards: no signal, exactly 0 (not NaN)
    assert torch.equal(adv[4:], torch.zeros(4))


def test_group_advantages_dr_grpo():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 1.0, 1.0])
    expected = [0.5, -0.5, -0.5, 0.5, 1.5, -0.5, -0.5, -0.5]  # r - group mean (0.5, 1.5)
    assert close(group_advantages(r, 4, scale_by_std=False), expected)
    assert close(get_advantage_estimator("dr_grpo")(r, 4), expected)
    assert get_advantage_estimator("grpo") is group_advantages


def test_group_advantages_bad_shapes_and_singletons():
    with pytest.raises(ValueError):
        group_advantages(torch.ones(7), 4)
    assert torch.equal(group_advantages(torch.tensor([1.0, 0.0, 5.0]), 1), torch.zeros(3))
    # integer rewards are accepted and promoted to float
    assert close(group_advantages(torch.tensor([1, 0]), 2, scale_by_std=False), [0.5, -0.5])


def test_broadcast_to_tokens():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), MASK)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


# ---------------------------------------------------------------- KL


def test_kl_penalty_kinds():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    assert close(kl_penalty(logp, ref, "k1"), [[1.0, -1.0]])
    assert close(kl_penalty(logp, ref, "k2"), [[0.5, 0.5]])
    # k3 = exp(ref - logp) - (ref - logp) - 1: e^-1 + 1 - 1 = 0.367879; e^1 - 1 - 1 = 0.718282
    assert close(kl_penalty(logp, ref, "k3"), [[math.exp(-1), math.e - 2]])
    assert close(kl_penalty(logp, ref, "abs"), [[1.0, 1.0]])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")


def test_kl_k3_nonnegative_and_clamped():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(4, 50, generator=g) * 3, torch.randn(4, 50, generator=g) * 3
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert torch.equal(kl_penalty(logp, logp, "k3"), torch.zeros(4, 50))
    # ref much likelier than pi: e^20 - 20 - 1 -> clamped to 10, and finite even at e^1000
    big = kl_penalty(torch.tensor([[-20.0, -1000.0]]), torch.tensor([[0.0, 0.0]]), "k3")
    assert torch.equal(big, torch.tensor([[10.0, 10.0]]))


# ---------------------------------------------------------------- PPO / GRPO


def _ppo_case():
    # token ratios 1.0, 1.5, 0.5 and a padding token with a huge ratio that must be ignored
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 100.0]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    return old, logp, adv, mask


def test_ppo_loss_by_hand():
    old, logp, adv, mask = _ppo_case()
    loss, m = policy_loss("ppo", old, logp, adv, mask)
    # t1: A=+1, r=1.0 -> -1.0 (inside the range)
    # t2: A=+1, r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped at 1 + 0.2)
    # t3: A=-1, r=0.5 -> max(0.5, 0.8)  = 0.8  (clipped at 1 - 0.2)
    assert close(loss, (-1.0 - 1.2 + 0.8) / 3)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    assert m["ratio_mean"] == pytest.approx(1.0)  # (1 + 1.5 + 0.5) / 3
    # k3(old -> new) = r - log r - 1: 0, 0.5 - ln 1.5, -0.5 + ln 2
    assert m["approx_kl"] == pytest.approx((0.5 - math.log(1.5) - 0.5 + math.log(2)) / 3)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())  # 0-d, detached
    loss.backward()
    # only the unclipped token has a gradient: d(-A r / 3)/d logp = -A r / 3
    assert close(logp.grad, [[-1 / 3, 0.0, 0.0, 0.0]])


def test_grpo_is_ppo_alias():
    old, logp, adv, mask = _ppo_case()
    assert get_policy_loss("grpo") is get_policy_loss("ppo")
    assert close(policy_loss("grpo", old, logp, adv, mask)[0], (-1.0 - 1.2 + 0.8) / 3)


def test_ppo_dual_clip():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[3.0, 0.0]], requires_grad=True)  # ratios e^3 = 20.09 and 1
    adv = torch.tensor([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, m = policy_loss("ppo", old, logp, adv, mask, clip_c=3.0)
    # t1: max(20.09, 1.2 * 1) = 20.09, capped by dual clip at -A * c = 3; t2: 1.0
    assert close(loss, (3.0 + 1.0) / 2)
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert close(logp.grad, [[0.0, 0.5]])  # capped token gets no gradient
    no_dual, _ = policy_loss("ppo", old, logp, adv, mask)
    assert close(no_dual, (math.exp(3) + 1.0) / 2, tol=1e-4)
    with pytest.raises(ValueError):
        policy_loss("ppo", old, logp, adv, mask, clip_c=1.0)


def test_ppo_clip_higher_asymmetry():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.25, 0.75]]))
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    # symmetric 0.2: t1 -> -1.2 (clipped), t2 -> 0.8 (clipped)
    loss, m = policy_loss("ppo", old, logp, adv, mask, clip_low=0.2, clip_high=0.2)
    assert close(loss, (-1.2 + 0.8) / 2) and m["clip_frac"] == 1.0
    # clip-higher 0.28: the upside token is free up to 1.28 -> -1.25; downside unchanged
    loss, m = policy_loss("ppo", old, logp, adv, mask, clip_low=0.2, clip_high=0.28)
    assert close(loss, (-1.25 + 0.8) / 2) and m["clip_frac"] == 0.5


def test_ppo_obeys_agg():
    old, logp, adv, mask = _ppo_case()
    loss, _ = policy_loss("ppo", old, logp, adv, mask, agg="seq-mean-token-sum")
    assert close(loss, -1.0 - 1.2 + 0.8)


# ---------------------------------------------------------------- GSPO


def _gspo_case():
    old = torch.zeros(2, 4)
    # row 0: log ratios 0.1, 0.3, -0.1 (+ padding) -> mean 0.1, s0 = e^0.1  = 1.105171
    # row 1: log ratios 0.0, -0.4 (+ padding)     -> mean -0.2, s1 = e^-0.2 = 0.818731
    logp = torch.tensor([[0.1, 0.3, -0.1, 5.0], [0.0, -0.4, 7.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return old, logp, mask


def test_gspo_value_and_gradient():
    old, logp, mask = _gspo_case()
    adv = torch.tensor([1.0, -0.5])[:, None] * mask
    loss, m = policy_loss(
        "gspo", old, logp, adv, mask, agg="seq-mean-token-mean", clip_low=0.2, clip_high=0.2
    )
    s0, s1 = math.exp(0.1), math.exp(-0.2)
    # both inside [0.8, 1.2]: seq-mean-token-mean of -A * s = mean(-1 * s0, 0.5 * s1)
    assert close(loss, (-s0 + 0.5 * s1) / 2)  # -0.347903
    assert m["clip_frac"] == 0.0
    assert m["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5)
    loss.backward()
    # d loss / d logp_t = -A_i * s_i / (|y_i| * B): every valid token of a row gets the same
    g0, g1 = -1.0 * s0 / (3 * 2), 0.5 * s1 / (2 * 2)  # -0.184195, 0.102341
    assert close(logp.grad, [[g0, g0, g0, 0.0], [g1, g1, 0.0, 0.0]])

    # and that is exactly the gradient of the paper's sequence-level objective
    logp2 = logp.detach().clone().requires_grad_()
    s = torch.exp(((logp2 - old) * mask).sum(-1) / mask.sum(-1))  # (B,)
    (-(torch.tensor([1.0, -0.5]) * s).mean()).backward()
    assert torch.allclose(logp.grad, logp2.grad, atol=1e-6)


def test_gspo_sequence_level_clipping():
    old, logp, mask = _gspo_case()
    adv = torch.tensor([1.0, 0.5])[:, None] * mask
    loss, m = policy_loss(
        "gspo", old, logp, adv, mask, agg="seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4
    )
    s1 = math.exp(-0.2)
    # row 0: A > 0 and s0 = 1.105 > 1 + 4e-4 -> every token clipped to -1.0004, no gradient
    # row 1: A > 0 and s1 < 1 -> the clip does not bind on the downside for A > 0
    assert close(loss, (-1.0004 - 0.5 * s1) / 2)
    assert m["clip_frac"] == pytest.approx(3 / 5)  # all three valid tokens of row 0
    loss.backward()
    g1 = -0.5 * s1 / (2 * 2)
    assert close(logp.grad, [[0.0, 0.0, 0.0, 0.0], [g1, g1, 0.0, 0.0]])


def test_gspo_defaults_and_agg():
    from grpo.algos import gspo_policy_loss

    old, logp, mask = _gspo_case()
    adv = torch.tensor([1.0, 0.5])[:, None] * mask
    # called directly, gspo takes the paper's values (seq-mean-token-mean, 3e-4 / 4e-4),
    # i.e. the clipped case above
    loss, _ = gspo_policy_loss(old, logp, adv, mask)
    assert close(loss, (-1.0004 - 0.5 * math.exp(-0.2)) / 2)
    # the dispatcher adds no defaults of its own: the same numbers by name
    loss, _ = policy_loss("gspo", old, logp, adv, mask)
    assert close(loss, (-1.0004 - 0.5 * math.exp(-0.2)) / 2)
    # ... and with token-mean and 0.2 / 0.2 asked for: s0 = e^0.1 < 1.2 is inside the range,
    # so (3 * -s0 + 2 * -0.5 s1) / 5
    loss, _ = policy_loss("gspo", old, logp, adv, mask, agg="token-mean", clip_low=0.2,
                          clip_high=0.2)  # fmt: skip
    assert close(loss, (3 * -math.exp(0.1) - 2 * 0.5 * math.exp(-0.2)) / 5)
    # token-mean is obeyed when asked for: (3 * -1.0004 + 2 * -0.5 s1) / 5
    loss, _ = policy_loss("gspo", old, logp, adv, mask, agg="token-mean", clip_low=3e-4,
                          clip_high=4e-4)  # fmt: skip
    assert close(loss, (3 * -1.0004 - 2 * 0.5 * math.exp(-0.2)) / 5)


def test_gspo_gradient_at_ratio_one_is_the_sequence_mean_policy_gradient():
    old, _, mask = _gspo_case()
    adv = torch.tensor([1.0, -0.5])
    logp = old.clone().requires_grad_()  # ratio 1 everywhere
    policy_loss("gspo", old, logp, adv[:, None] * mask, mask, agg="seq-mean-token-mean")[
        0
    ].backward()
    pg = old.clone().requires_grad_()  # vanilla PG: -A * logp, per-sequence token mean
    (-(adv * (pg * mask).sum(-1) / mask.sum(-1)).mean()).backward()
    assert torch.allclose(logp.grad, pg.grad, atol=1e-7)


def test_zero_advantage_gives_zero_policy_gradient():
    old, logp, mask = _gspo_case()
    for name in ("ppo", "gspo"):
        lp = logp.detach().clone().requires_grad_()
        loss, _ = policy_loss(name, old, lp, torch.zeros_like(mask), mask)
        loss.backward()
        assert torch.all(lp.grad == 0) and torch.isfinite(loss)


# ---------------------------------------------------------------- registry


def test_registry_duplicate_and_unknown():
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"'gspo'.*'ppo'|valid"):
        get_policy_loss("nope")
    with pytest.raises(ValueError, match="dr_grpo"):
        get_advantage_estimator("nope")


def test_registry_custom_loss():
    @register_policy_loss("_test_const")
    def const_loss(old_logp, logp, advantages, mask, **kw):
        return logp.sum() * 0, {"kw": float(len(kw))}

    try:
        old, logp, adv, mask = _ppo_case()
        _, m = policy_loss("_test_const", old, logp, adv, mask, agg="token-mean", clip_c=None)
        assert m == {"kw": 1.0}  # only the options given (not None) are forwarded
    finally:
        POLICY_LOSSES.remove("_test_const")


BUILT_IN_LOSSES = (
    "ppo", "grpo", "gspo", "sapo", "geo_mean", "gmpo", "clip_cov", "kl_cov", "cispo", "dppo_tv",
    "dppo_kl",
)  # fmt: skip


@pytest.mark.parametrize("name", BUILT_IN_LOSSES)
def test_built_in_losses_follow_the_policy_loss_contract(name):
    """grpo.algos.PolicyLoss: four positional tensors, then keyword-only options, each with its
    default (the trainer and the config read a loss's defaults from its signature)."""
    params = list(inspect.signature(get_policy_loss(name)).parameters.values())
    assert [p.name for p in params[:4]] == ["old_logp", "logp", "advantages", "mask"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params[:4])
    options = params[4:]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in options), name
    # every built-in loss takes an aggregation and the rollout correction's weights
    assert {"agg", "is_weights"} <= {p.name for p in options}, name
