"""Checks for RLOO, REINFORCE++, GAE, token-level rewards and the clipped value loss.

Expected values are worked out by hand or by plain float64 python loops written here, never
by calling the function under test.
"""

import math

import pytest
import torch

from grpo.algos import (
    broadcast_to_tokens,
    gae,
    get_advantage_estimator,
    get_token_advantage_estimator,
    policy_loss,
    register_token_advantage_estimator,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
    value_loss,
)


def close(a, b, tol=1e-5):
    a = torch.as_tensor(a, dtype=torch.float64)
    return torch.allclose(a, torch.as_tensor(b, dtype=torch.float64), atol=tol)


# Ragged batch: row 0 has 3 valid tokens, row 1 has 2. Padding carries junk that must be ignored.
RAGGED_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
RAGGED_REWARDS = torch.tensor([[0.5, -1.0, 2.0, 9.0], [1.0, 3.0, -7.0, 5.0]])
# Left padding and a gap: "next token" means the next valid one, padding is skipped.
GAPPY_MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]])


def _rows(x, mask):
    """Per row: the valid positions and the python-float values at them."""
    out = []
    for xr, mr in zip(x.tolist(), mask.tolist(), strict=True):
        idx = [t for t, m in enumerate(mr) if m > 0]
        out.append((idx, [float(xr[t]) for t in idx]))
    return out


def _whiten_ref(per_row, shape):
    """Whiten {(b, t): value} over all entries, zeros elsewhere: verl's convention, unbiased
    variance (divides by n - 1) and eps 1e-8 inside the square root."""
    vals = list(per_row.values())
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    out = [[0.0] * shape[1] for _ in range(shape[0])]
    for (b, t), v in per_row.items():
        out[b][t] = (v - mean) / math.sqrt(var + 1e-8)
    return out


# ---------------------------------------------------------------- RLOO


def test_rloo_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv = rloo_advantages(r, 4)
    # group 1: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3; group 2: 1 - 1 = 0
    t = 2 / 3
    assert close(adv, [t, -t, -t, t, 0, 0, 0, 0])
    assert torch.equal(adv[4:], torch.zeros(4))
    assert not adv.isnan().any()
    assert get_advantage_estimator("rloo") is rloo_advantages


def test_rloo_matches_leave_one_out_definition():
    r = torch.tensor([3.0, -1.0, 0.5, 2.0, 0.0, 1.0])
    adv = rloo_advantages(r, 3).tolist()
    vals = r.tolist()
    for g in range(2):
        grp = vals[3 * g : 3 * g + 3]
        for i, ri in enumerate(grp):
            others = grp[:i] + grp[i + 1 :]
            assert adv[3 * g + i] == pytest.approx(ri - sum(others) / 2, abs=1e-6)


def test_rloo_errors():
    with pytest.raises(ValueError, match="divisible"):
        rloo_advantages(torch.ones(7), 4)
    with pytest.raises(ValueError, match=">= 2"):
        rloo_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match=">= 2"):
        rloo_advantages(torch.ones(4), 0)
    with pytest.raises(ValueError, match="divisible"):
        rloo_advantages(torch.ones(2, 4), 4)


def test_rloo_equal_rewards_give_zero_policy_gradient():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.randn(2, 3, generator=g) * 0.1 - 1.0

    def grad_for(rewards):
        logp = (old + torch.randn(2, 3, generator=g) * 0.1).requires_grad_()
        adv = broadcast_to_tokens(rloo_advantages(rewards, 2), mask)  # (B, T)
        loss, _ = policy_loss("ppo", old, logp, adv, mask)
        loss.backward()
        return logp.grad

    assert torch.equal(grad_for(torch.tensor([1.0, 1.0])), torch.zeros(2, 3))
    assert grad_for(torch.tensor([1.0, 0.0])).abs().sum() > 0  # a real signal does move it


# ---------------------------------------------------------------- token-level rewards


def test_token_level_rewards_placement():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    out = token_level_rewards(torch.tensor([2.0, -1.0, 5.0, 3.0]), mask)
    expected = [[0.0, 2.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0]]
    assert torch.equal(out, torch.tensor(expected))
    # integer rewards are promoted to float
    assert token_level_rewards(torch.tensor([1, 0, 1, 1]), mask).dtype == torch.float32


# ---------------------------------------------------------------- REINFORCE++


def _reinforce_pp_ref(rewards, mask, gamma):
    returns = {}
    for b, (idx, r) in enumerate(_rows(rewards, mask)):
        g = 0.0
        for t, rt in zip(reversed(idx), reversed(r), strict=True):
            g = rt + gamma * g
            returns[(b, t)] = g
    return returns


@pytest.mark.parametrize("mask", [RAGGED_MASK, GAPPY_MASK], ids=["ragged", "gappy"])
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_reinforce_pp_matches_loop(mask, gamma):
    out = reinforce_pp_advantages(RAGGED_REWARDS, mask, gamma=gamma)
    expected = _whiten_ref(_reinforce_pp_ref(RAGGED_REWARDS, mask, gamma), mask.shape)
    assert close(out, expected)
    assert torch.equal(out * (1 - mask), torch.zeros_like(out))  # padding is exactly 0
    valid = out[mask > 0].double()
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-5)


def test_reinforce_pp_by_hand_and_registry():
    # row 0 returns with gamma 0.5: t2 = 2, t1 = -1 + 1 = 0, t0 = 0.5 + 0 = 0.5
    # row 1 returns: t1 = 3, t0 = 1 + 1.5 = 2.5 -> values {0.5, 0, 2, 2.5, 3}, mean 1.6
    vals = [0.5, 0.0, 2.0, 2.5, 3.0]
    std = math.sqrt(sum((v - 1.6) ** 2 for v in vals) / 4)  # unbiased: 1.30384
    out = get_token_advantage_estimator("reinforce_pp")(RAGGED_REWARDS, RAGGED_MASK, gamma=0.5)
    w = [(v - 1.6) / std for v in vals]
    assert close(out, [[w[0], w[1], w[2], 0.0], [w[3], w[4], 0.0, 0.0]])
    assert get_token_advantage_estimator("reinforce_pp") is reinforce_pp_advantages
    with pytest.raises(ValueError, match="already registered"):
        register_token_advantage_estimator("reinforce_pp")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="reinforce_pp"):
        get_token_advantage_estimator("nope")


def test_reinforce_pp_from_sequence_rewards():
    # outcome reward on the last token, gamma 1: every valid token's return is its row's reward
    seq = torch.tensor([1.0, 0.0])
    out = reinforce_pp_advantages(token_level_rewards(seq, RAGGED_MASK), RAGGED_MASK)
    # returns {1, 1, 1, 0, 0}: mean 0.6, unbiased variance (3 * 0.16 + 2 * 0.36) / 4 = 0.3
    hi, lo = 0.4 / math.sqrt(0.3), -0.6 / math.sqrt(0.3)
    assert close(out, [[hi, hi, hi, 0.0], [lo, lo, 0.0, 0.0]])
    # empty batch gives zeros, not NaN
    assert torch.equal(
        reinforce_pp_advantages(RAGGED_REWARDS, torch.zeros(2, 4)), torch.zeros(2, 4)
    )


# ---------------------------------------------------------------- GAE

GAE_VALUES = torch.tensor([[0.2, -0.3, 0.6, 4.0], [0.1, 0.9, -2.0, 8.0]], dtype=torch.float64)


def _gae_ref(rewards, values, mask, gamma, lam):
    raw, rets = {}, {}
    for b, ((idx, r), (_, v)) in enumerate(
        zip(_rows(rewards, mask), _rows(values, mask), strict=True)
    ):
        a_next, v_next = 0.0, 0.0  # the episode ends after the last valid token
        for k in reversed(range(len(idx))):
            delta = r[k] + gamma * v_next - v[k]
            a_next = delta + gamma * lam * a_next
            v_next = v[k]
            raw[(b, idx[k])] = a_next
            rets[(b, idx[k])] = a_next + v[k]
    shape = mask.shape
    ret_mat = [[rets.get((b, t), 0.0) for t in range(shape[1])] for b in range(shape[0])]
    return _whiten_ref(raw, shape), ret_mat


@pytest.mark.parametrize("mask", [RAGGED_MASK, GAPPY_MASK], ids=["ragged", "gappy"])
def test_gae_matches_loop(mask):
    rewards = RAGGED_REWARDS.double()
    adv, ret = gae(rewards, GAE_VALUES, mask, gamma=0.9, lam=0.8)
    exp_adv, exp_ret = _gae_ref(rewards, GAE_VALUES, mask, 0.9, 0.8)
    assert adv.dtype == ret.dtype == torch.float64
    assert close(ret, exp_ret, tol=1e-12)
    assert close(adv, exp_adv, tol=1e-9)
    pad = mask == 0
    assert (adv[pad] == 0).all() and (ret[pad] == 0).all()


def test_gae_by_hand():
    # r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8
    # delta_1 = 1 + 0.9 * 0 - 0.2 = 0.8              A_1 = 0.8
    # delta_0 = 0 + 0.9 * 0.2 - 0.5 = -0.32          A_0 = -0.32 + 0.72 * 0.8 = 0.256
    # returns = A + V = [0.756, 1.0]; advantages whitened: mean 0.528, deviations -+0.272,
    # unbiased variance 2 * 0.272^2 / 1 -> -+1 / sqrt(2); the population variance gives -+1
    args = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2), 0.9, 0.8
    adv, ret = gae(*args)
    assert close(ret, [[0.756, 1.0]])
    assert close(adv, [[-(0.5**0.5), 0.5**0.5]])
    assert close(gae(*args, unbiased=False)[0], [[-1.0, 1.0]])


def test_gae_lambda_one_returns_are_discounted_returns():
    # lam = 1 telescopes the values away: returns_t = sum_k gamma^k r_{t+k}
    rewards = RAGGED_REWARDS.double()
    _, ret = gae(rewards, GAE_VALUES, RAGGED_MASK, gamma=0.5, lam=1.0)
    row0 = [0.5 - 0.5 + 0.5, -1.0 + 1.0, 2.0, 0.0]  # 0.5 + 0.5 * (-1) + 0.25 * 2
    row1 = [1.0 + 1.5, 3.0, 0.0, 0.0]
    assert close(ret, [row0, row1], tol=1e-12)


def test_gae_values_get_no_gradient():
    values = GAE_VALUES.float().clone().requires_grad_()
    adv, ret = gae(RAGGED_REWARDS, values, RAGGED_MASK, 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


# ---------------------------------------------------------------- value loss


def _value_case():
    # t0: v - old = 0.5 -> clamped to 0.2, v_clipped 0.7: (1 - 1.5)^2 = 0.25 < (0.7 - 1.5)^2 = 0.64
    # t1: v - old = 0.1 -> inside the clip, v_clipped = v: both errors (0.5 - 0)^2 = 0.25
    # t2: v - old = 1.0 -> v_clipped 1.2: (2 - 1.5)^2 = 0.25 > (1.2 - 1.5)^2 = 0.09
    values = torch.tensor([[1.0, 0.5, 2.0]], requires_grad=True)
    returns = torch.tensor([[1.5, 0.0, 1.5]])
    old = torch.tensor([[0.5, 0.4, 1.0]])
    return values, returns, old, torch.ones(1, 3)


def test_value_loss_clipped_by_hand():
    values, returns, old, mask = _value_case()
    loss, m = value_loss(values, returns, old, mask, clip=0.2)
    assert close(loss, 0.5 * (0.64 + 0.25 + 0.25) / 3)  # 0.19
    assert m["vf_clip_frac"] == pytest.approx(1 / 3)  # only t0
    # returns [1.5, 0, 1.5]: mean 1, Var 0.5; residuals [0.5, -0.5, -0.5]: mean -1/6, Var 2/9
    assert m["vf_explained_var"] == pytest.approx(1 - (2 / 9) / 0.5, abs=1e-6)  # 5/9
    assert m["value_mean"] == pytest.approx(3.5 / 3)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())  # 0-d, detached
    loss.backward()
    # t0 is held by the clipped branch (no gradient); t1, t2: d 0.5 (v - R)^2 / 3 = (v - R) / 3
    assert close(values.grad, [[0.0, 0.5 / 3, 0.5 / 3]])


def test_value_loss_unclipped_and_agg():
    values, returns, old, mask = _value_case()
    loss, m = value_loss(values, returns, old, mask, clip=None)
    assert close(loss, 0.5 * (0.25 + 0.25 + 0.25) / 3)  # 0.125
    assert m["vf_clip_frac"] == 0.0
    loss, _ = value_loss(values, returns, old, mask, agg="seq-mean-token-sum")
    assert close(loss, 0.5 * (0.64 + 0.25 + 0.25))
    with pytest.raises(ValueError):
        value_loss(values, returns, old, mask, clip=0.0)


def test_value_loss_ignores_padding():
    values, returns, old, mask = _value_case()
    pad = lambda x, junk: torch.cat([x.detach(), torch.tensor([[junk]])], dim=-1)  # noqa: E731
    loss, m = value_loss(
        pad(values, 50.0), pad(returns, -9.0), pad(old, 0.0), pad(mask, 0.0), clip=0.2
    )
    ref_loss, ref_m = value_loss(values, returns, old, mask, clip=0.2)
    assert close(loss, ref_loss.item())
    assert {k: float(v) for k, v in m.items()} == pytest.approx(
        {k: float(v) for k, v in ref_m.items()}
    )


def test_value_loss_perfect_critic_explains_everything():
    returns = torch.tensor([[1.0, 2.0, 4.0]])
    _, m = value_loss(returns.clone(), returns, returns.clone(), torch.ones(1, 3))
    assert m["vf_explained_var"] == pytest.approx(1.0)
