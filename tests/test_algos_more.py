"""CISPO, SAPO, GMPO, Clip-Cov, KL-Cov, DPPO, REINFORCE++-baseline and GRPO pass@k.

For each: numbers worked out by hand on a tiny input, agreement with a plain float64 python
loop written here (never the function under test), gradient checks, two optimizer steps of a
tiny policy through `policy_loss(name, ...)`, and verl's numbers on one fixed input (produced
by running verl's own functions, see VERL below).
"""

import math

import pytest
import torch

from grpo.algos import (
    get_advantage_estimator,
    get_policy_loss,
    grpo_passk_advantages,
    masked_whiten,
    policy_loss,
    reinforce_pp_baseline_advantages,
)
from grpo.config import load_config
from grpo.plan import own_default, plan_loss

NEW_LOSSES = ["cispo", "sapo", "geo_mean", "gmpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl"]


def close(a, b, tol=1e-6):
    a = torch.as_tensor(a, dtype=torch.float64)
    return torch.allclose(a, torch.as_tensor(b, dtype=torch.float64), atol=tol)


def grad_of(name, old, logp, adv, mask, **kw):
    """(loss, d loss / d logp, metrics) of the loss `name`."""
    lp = logp.clone().requires_grad_()
    loss, metrics = policy_loss(name, old, lp, adv, mask, **kw)
    loss.backward()
    return loss.detach(), lp.grad, metrics


# ---------------------------------------------------------------- float64 loops


def _valid(mask_row):
    return [t for t, m in enumerate(mask_row) if m > 0]


def _agg(per_token, mask, agg):
    """per_token: {(b, t): loss} over valid tokens -> the scalar of agg_loss."""
    if agg == "token-mean":
        return sum(per_token.values()) / max(len(per_token), 1)
    assert agg == "seq-mean-token-mean"
    rows = []
    for b, mrow in enumerate(mask):
        idx = _valid(mrow)
        rows.append(sum(per_token[(b, t)] for t in idx) / len(idx) if idx else 0.0)
    return sum(rows) / len(rows)


def _tokens(old, logp, adv, mask):
    """(b, t, old, logp, adv) for every valid token, as python floats."""
    for b, mrow in enumerate(mask.tolist()):
        for t in _valid(mrow):
            yield b, t, float(old[b, t]), float(logp[b, t]), float(adv[b, t])


def ref_cispo(old, logp, adv, mask, clip_low=1.0, clip_high=0.2, agg="token-mean"):
    out = {}
    for b, t, o, lp, a in _tokens(old, logp, adv, mask):
        w = min(max(math.exp(lp - o), 1 - clip_low), 1 + clip_high)
        out[(b, t)] = -w * a * lp
    return _agg(out, mask.tolist(), agg)


def ref_sapo(old, logp, adv, mask, tau_pos=1.0, tau_neg=1.05, agg="seq-mean-token-mean"):
    out = {}
    for b, t, o, lp, a in _tokens(old, logp, adv, mask):
        tau = tau_pos if a > 0 else tau_neg
        gate = 4.0 / tau / (1.0 + math.exp(-tau * (math.exp(lp - o) - 1.0)))
        out[(b, t)] = -gate * a
    return _agg(out, mask.tolist(), agg)


def ref_gmpo(old, logp, adv, mask, clip_low=0.4, clip_high=0.4):
    losses = []
    for b, mrow in enumerate(mask.tolist()):
        idx = _valid(mrow)
        if not idx:
            losses.append(0.0)
            continue
        used, a_sum = 0.0, 0.0
        for t in idx:
            lr, a = float(logp[b, t] - old[b, t]), float(adv[b, t])
            a_sum += a
            if a > 0:
                used += min(lr, clip_high)  # a positive advantage gains nothing past clip_high
            elif a < 0:
                used += max(lr, -clip_low)
        losses.append(-(a_sum / len(idx)) * math.exp(used / len(idx)))
    return sum(losses) / len(losses)


def _cov(logp, adv, mask):
    toks = list(_tokens(logp, logp, adv, mask))
    mean_a = sum(a for *_, a in toks) / len(toks)
    mean_lp = sum(lp for _, _, _, lp, _ in toks) / len(toks)
    return {(b, t): (a - mean_a) * (lp - mean_lp) for b, t, _, lp, a in toks}


def ref_clip_cov_all(old, logp, adv, mask, lb, ub, clip=0.2):
    """Clip-Cov when every candidate is detached (clip_cov_ratio large enough), token-mean."""
    cov, out = _cov(logp, adv, mask), {}
    for b, t, o, lp, a in _tokens(old, logp, adv, mask):
        r = math.exp(lp - o)
        pg, pg_clipped = -a * r, -a * min(max(r, 1 - clip), 1 + clip)
        candidate = not pg_clipped > pg and lb < cov[(b, t)] < ub
        out[(b, t)] = 0.0 if candidate else max(pg, pg_clipped)
    return _agg(out, mask.tolist(), "token-mean")


def ref_kl_cov(old, logp, adv, mask, ratio=2e-4, coef=0.1):
    cov, out = _cov(logp, adv, mask), {}
    k = max(1, int(len(cov) * ratio))
    top = set(sorted(cov, key=cov.get, reverse=True)[:k])
    for b, t, o, lp, a in _tokens(old, logp, adv, mask):
        out[(b, t)] = -a * math.exp(lp - o) + (coef * abs(lp - o) if (b, t) in top else 0.0)
    return _agg(out, mask.tolist(), "token-mean")


def ref_dppo(kind, old, logp, adv, mask, low, high, cap=20.0):
    out = {}
    for b, t, o, lp, a in _tokens(old, logp, adv, mask):
        p, q = math.exp(lp), math.exp(o)
        if kind == "tv":
            inside = p - q <= high if a > 0 else p - q >= -low
        else:
            kl = q * (o - lp) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            inside = (kl <= high or p <= q) if a > 0 else (kl <= low or p >= q)
        out[(b, t)] = -a * min(math.exp(lp - o), cap) * lp if inside else 0.0
    return _agg(out, mask.tolist(), "token-mean")


def random_case(seed, empty_row=False):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 6
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    logp = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5).clamp(max=-1e-3)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    if empty_row:
        lens[2] = 0
    mask = (torch.arange(T)[None] < lens[:, None]).double()
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64) * mask
    adv[0, 0] = -adv[0, 0]  # token-level advantages with mixed signs within a row
    return old, logp, adv, mask


CASES = [(0, False), (1, False), (2, True), (3, False)]


@pytest.mark.parametrize("seed, empty_row", CASES)
def test_new_losses_match_the_float64_loops(seed, empty_row):
    old, logp, adv, mask = random_case(seed, empty_row)

    def ours(name, **kw):
        return policy_loss(name, old, logp, adv, mask, **kw)[0].item()

    assert ours("cispo") == pytest.approx(ref_cispo(old, logp, adv, mask), abs=1e-12)
    assert ours("cispo", clip_low=0.1, clip_high=0.3, agg="seq-mean-token-mean") == (
        pytest.approx(ref_cispo(old, logp, adv, mask, 0.1, 0.3, "seq-mean-token-mean"), abs=1e-12)
    )
    assert ours("sapo") == pytest.approx(ref_sapo(old, logp, adv, mask), abs=1e-12)
    assert ours("sapo", tau_pos=2.0, tau_neg=3.0, agg="token-mean") == pytest.approx(
        ref_sapo(old, logp, adv, mask, 2.0, 3.0, "token-mean"), abs=1e-12
    )
    assert ours("geo_mean") == pytest.approx(ref_gmpo(old, logp, adv, mask), abs=1e-12)
    assert ours("gmpo", clip_low=0.1, clip_high=0.3) == pytest.approx(
        ref_gmpo(old, logp, adv, mask, 0.1, 0.3), abs=1e-12
    )
    assert ours("clip_cov", clip_cov_ratio=1.0, clip_cov_lb=0.05) == pytest.approx(
        ref_clip_cov_all(old, logp, adv, mask, 0.05, 5.0), abs=1e-12
    )
    assert ours("kl_cov") == pytest.approx(ref_kl_cov(old, logp, adv, mask), abs=1e-12)
    assert ours("kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=1.0) == pytest.approx(
        ref_kl_cov(old, logp, adv, mask, 0.3, 1.0), abs=1e-12
    )
    assert ours("dppo_tv") == pytest.approx(
        ref_dppo("tv", old, logp, adv, mask, 0.15, 0.15), abs=1e-12
    )
    assert ours("dppo_kl") == pytest.approx(
        ref_dppo("kl", old, logp, adv, mask, 0.05, 0.05), abs=1e-12
    )
    assert ours("dppo_tv", clip_low=0.05, clip_high=0.3, clip_c=1.5) == pytest.approx(
        ref_dppo("tv", old, logp, adv, mask, 0.05, 0.3, cap=1.5), abs=1e-12
    )


# ---------------------------------------------------------------- verl's numbers

# One fixed input run through verl's own functions (verl-project/verl @1dda039,
# verl/trainer/ppo/core_algos.py: compute_policy_loss_<name> with clip_ratio_low/high set to
# this project's defaults for the loss, clip_ratio_c=20 for DPPO, tau 1.0/1.05, and
# clip_cov_ratio=1.0, clip_cov_lb=0.3 so that Clip-Cov's random draw takes every candidate),
# in float64: (loss, d loss / d log_prob).
VERL_OLD = [[-0.7, -1.2, -2.3, -0.1], [-0.4, -1.9, -0.9, -3.0], [-1.1, -0.2, -2.6, -0.5]]
VERL_NEW = [[-0.4, -1.6, -1.5, -0.2], [-0.9, -1.3, -1.0, -2.2], [-0.8, -0.6, -2.9, -0.3]]
VERL_MASK = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
VERL_ADV = [[1.5, -0.3, 1.5, 1.5], [-0.8, -0.8, -0.8, 0.0], [0.6, 0.6, 0.0, 0.0]]
VERL = {
    "cispo": (0.197604534496, [[-0.2, 0.022344001535, -0.2, -0.150806236339],
                               [0.053913836419, 0.106666666667, 0.080429992714, 0.0],
                               [-0.08, -0.044688003069, 0.0, 0.0]]),
    "sapo": (-0.746573709929, [[-0.163672624343, 0.016265834123, -0.195236354739, -0.112848996321],
                               [0.051677137686, 0.13518035523, 0.080229569791, 0.0],
                               [-0.130938099147, -0.065243089564, 0.0, 0.0]]),
    "geo_mean": (-0.282485404108, [[-0.091986220461, 0.0, 0.0, -0.091986220461],
                                   [0.0, 0.091901787245, 0.091901787245, 0.0],
                                   [-0.095122941523, -0.095122941523, 0.0, 0.0]]),
    "kl_cov": (-0.561619725222, [[-0.224976467929, 0.022344001535, -0.370923488082, -0.16191734745],
                                 [0.053913836419, 0.16196611559, 0.080429992714, 0.0],
                                 [-0.089990587172, -0.044688003069, 0.0, 0.0]]),
    "dppo_tv": (0.358615405533, [[0.0, 0.022344001535, -0.370923488082, -0.150806236339],
                                 [0.0, 0.16196611559, 0.080429992714, 0.0],
                                 [-0.089990587172, -0.044688003069, 0.0, 0.0]]),
    "dppo_kl": (-0.19776982659, [[0.0, 0.022344001535, 0.0, -0.150806236339],
                                 [0.0, 0.16196611559, 0.080429992714, 0.0],
                                 [-0.089990587172, -0.044688003069, 0.0, 0.0]]),
    "clip_cov": (-0.346480232577, [[0.0, 0.0, 0.0, 0.0],
                                   [0.0, 0.0, 0.080429992714, 0.0],
                                   [0.0, -0.044688003069, 0.0, 0.0]]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(VERL))
def test_new_losses_agree_with_verl(name):
    t = [torch.tensor(x, dtype=torch.float64) for x in (VERL_OLD, VERL_NEW, VERL_ADV, VERL_MASK)]
    old, new, adv, mask = t
    kw = {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.3} if name == "clip_cov" else {}
    loss, grad, _ = grad_of(name, old, new, adv, mask, **kw)
    want_loss, want_grad = VERL[name]
    assert loss.item() == pytest.approx(want_loss, abs=1e-7)  # verl adds 1e-8 to denominators
    assert close(grad, want_grad, tol=1e-7)


# ---------------------------------------------------------------- CISPO

LN = math.log


def test_cispo_by_hand_and_its_weight_has_no_gradient():
    # old p = 0.5 everywhere; ratios 1.5, 1.0, 0.5 | 2.0, 0.8 -> weights (clip_high 0.2, no
    # lower bound) 1.2, 1.0, 0.5 | 1.2, 0.8
    ratios = torch.tensor([[1.5, 1.0, 0.5], [2.0, 0.8, 1.0]], dtype=torch.float64)
    old = torch.full_like(ratios, LN(0.5))
    logp = old + ratios.log()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, grad, metrics = grad_of("cispo", old, logp, adv, mask)
    # -w * A * log p per token, token-mean over 5
    want = (-1.2 * LN(0.75) - 1.0 * LN(0.5) - 0.5 * LN(0.25) + 1.2 * LN(1.0) + 0.8 * LN(0.4)) / 5
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert metrics["clip_frac"].item() == pytest.approx(2 / 5)  # 1.5 and 2.0 capped at 1.2
    # stop-gradient weight: d loss / d log p = -w * A / 5 exactly (no d w / d log p term),
    # so a capped token keeps its gradient, unlike PPO's clip
    want_grad = [[-1.2 / 5, -1.0 / 5, -0.5 / 5], [1.2 / 5, 0.8 / 5, 0.0]]
    assert close(grad, want_grad, tol=1e-12)
    _, ppo_grad, _ = grad_of("ppo", old, logp, adv, mask)
    assert ppo_grad[0, 0] == 0 and grad[0, 0] != 0
    # a lower bound when asked for: 0.5 -> 0.9 with clip_low 0.1
    _, grad, _ = grad_of("cispo", old, logp, adv, mask, clip_low=0.1)
    assert grad[0, 2].item() == pytest.approx(-0.9 / 5)


# ---------------------------------------------------------------- SAPO


def test_sapo_by_hand_and_gradient():
    # one row, A = +1 (tau 1): ratios 1 and 1 + ln 3 -> gates 4 * sigmoid(0) = 2 and
    # 4 * sigmoid(ln 3) = 4 * 3/4 = 3; seq-mean-token-mean: -(2 + 3) / 2
    old = torch.zeros(2, 2, dtype=torch.float64) + LN(0.5)
    logp = old + torch.tensor([[0.0, LN(1 + LN(3))], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    loss, grad, metrics = grad_of("sapo", old, logp, adv, mask)
    # row 1, A = -1 (tau_neg 1.05) on policy: gate 2 / 1.05 each, loss +2 / 1.05
    assert loss.item() == pytest.approx((-2.5 + 2 / 1.05) / 2, abs=1e-12)
    # on policy f'(1) * r = 1: exactly the policy gradient -A / (T * B), whatever tau
    assert grad[0, 0].item() == pytest.approx(-1 / 4) and grad[1, 0].item() == pytest.approx(1 / 4)
    # r = 1 + ln 3: f'(r) * r = 4 * (3/4) * (1/4) * r
    assert grad[0, 1].item() == pytest.approx(-0.75 * (1 + LN(3)) / 4)
    assert metrics["gate_weight_mean"].item() == pytest.approx((1 + 0.75 + 1 + 1) / 4)
    # far from the old policy the gate saturates: almost no gradient, but no hard zero
    _, far, _ = grad_of("sapo", old, old + LN(12.0), adv, mask)
    assert 0 < far[0, 0].abs().item() < 1e-3


# ---------------------------------------------------------------- GMPO


def test_gmpo_by_hand_and_gradient():
    # row 0: A = +1, log-ratios 0.2, 0.6 -> 0.6 capped at 0.4 -> ratio exp((0.2 + 0.4) / 2)
    # row 1: A = -1, log-ratios -0.6, 0.2 -> -0.6 raised to -0.4 -> ratio exp((-0.4 + 0.2) / 2)
    old = torch.full((2, 2), -1.0, dtype=torch.float64)
    logp = old + torch.tensor([[0.2, 0.6], [-0.6, 0.2]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    loss, grad, metrics = grad_of("geo_mean", old, logp, adv, mask)
    assert loss.item() == pytest.approx((-math.exp(0.3) + math.exp(-0.1)) / 2, abs=1e-12)
    assert metrics["clip_frac"].item() == pytest.approx(2 / 4)
    # d/d log p_t of -A * exp(mean log r) = -A * ratio / |o|, then / B; 0 where clipped
    want = [[-math.exp(0.3) / 4, 0.0], [0.0, math.exp(-0.1) / 4]]
    assert close(grad, want, tol=1e-12)
    assert get_policy_loss("gmpo") is get_policy_loss("geo_mean")
    # sequence-level (B,) advantages give the same loss
    same, _ = policy_loss("geo_mean", old, logp, torch.tensor([1.0, -1.0]).double(), mask)
    assert same.item() == pytest.approx(loss.item(), abs=1e-12)


def test_gmpo_outlier_token_moves_the_sequence_less_than_the_arithmetic_mean():
    # one token's ratio at e^3 in a row of 4 (negative advantage: no clip on that side)
    old = torch.full((1, 4), -2.0, dtype=torch.float64)
    logp = old + torch.tensor([[3.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    adv, mask = torch.full((1, 4), -1.0, dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)
    gm, _ = policy_loss("geo_mean", old, logp, adv, mask)
    assert gm.item() == pytest.approx(math.exp(3 / 4))  # geometric: e^(3/4) = 2.1
    arithmetic = (math.exp(3) + 3) / 4  # 5.8: what the token mean of -A * r would be
    assert gm.item() < arithmetic / 2


# ---------------------------------------------------------------- Clip-Cov / KL-Cov

# One row: A = 2, 1, -2, -1 (mean 0), log p = -0.5, -3.5, -0.5, -3.5 (mean -2)
# -> Cov = 2 * 1.5, 1 * -1.5, -2 * 1.5, -1 * -1.5 = 3, -1.5, -3, 1.5
COV_ADV = torch.tensor([[2.0, 1.0, -2.0, -1.0]], dtype=torch.float64)
COV_LOGP = torch.tensor([[-0.5, -3.5, -0.5, -3.5]], dtype=torch.float64)
COV_MASK = torch.ones(1, 4, dtype=torch.float64)


def test_clip_cov_by_hand():
    # on policy (ratio 1), no PPO clip: candidates are the tokens with Cov in (1, 5): 0 and 3
    both, grad, metrics = grad_of(
        "clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, clip_cov_ratio=0.5
    )  # max(1, int(0.5 * 4)) = 2: both detached; left -A * r of tokens 1, 2: (-1 + 2) / 4
    assert both.item() == pytest.approx(0.25)
    assert close(grad, [[0.0, -1 / 4, 2 / 4, 0.0]])
    assert metrics["cov_clip_frac"].item() == pytest.approx(0.5)
    # bounds exclude token 0 (Cov 3 >= ub 2): only token 3 is detached
    one, _, _ = grad_of(
        "clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, clip_cov_ratio=0.5, clip_cov_ub=2.0
    )
    assert one.item() == pytest.approx((-2 - 1 + 2) / 4)
    # default ratio 2e-4: max(1, int(...)) = 1 of the 2 candidates, drawn with torch's RNG
    torch.manual_seed(0)
    a, ga, m = grad_of("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK)
    torch.manual_seed(0)
    b, gb, _ = grad_of("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK)
    assert m["cov_clip_frac"].item() == pytest.approx(1 / 4) and torch.equal(ga, gb)
    assert a.item() in (pytest.approx((-1 + 2 + 1) / 4), pytest.approx((-2 - 1 + 2) / 4))
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        policy_loss("clip_cov", COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, clip_cov_ratio=0.0)


def test_kl_cov_by_hand():
    # token 0 (Cov 3, the largest) moved: log r = 0.1; k = max(1, int(4 * 0.25)) = 1
    old = COV_LOGP - torch.tensor([[0.1, 0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, grad, metrics = grad_of(
        "kl_cov", old, COV_LOGP, COV_ADV, COV_MASK, kl_cov_ratio=0.25, ppo_kl_coef=0.5
    )
    want = (-2 * math.exp(0.1) - 1 + 2 + 1 + 0.5 * 0.1) / 4  # -A r, plus 0.5 |log r| on token 0
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert metrics["kl_cov_frac"].item() == pytest.approx(1 / 4)
    # gradient: -A r / 4 everywhere, plus 0.5 * sign(log r) / 4 on the penalised token
    want_grad = [[(-2 * math.exp(0.1) + 0.5) / 4, -1 / 4, 2 / 4, 1 / 4]]
    assert close(grad, want_grad, tol=1e-12)
    # default coefficient 0.1 and ratio 2e-4 (one token)
    loss, _, _ = grad_of("kl_cov", old, COV_LOGP, COV_ADV, COV_MASK)
    assert loss.item() == pytest.approx((-2 * math.exp(0.1) + 2 + 0.1 * 0.1) / 4, abs=1e-12)


# ---------------------------------------------------------------- DPPO

# p_old = 0.5 everywhere; A = +1 on tokens 0, 1 (p rises to 0.6, 0.7), A = -1 on tokens 2, 3
# (p falls to 0.4, 0.3), A = +1 on token 4 (p falls to 0.2: toward the old policy's side)
DPPO_P = torch.tensor([[0.6, 0.7, 0.4, 0.3, 0.2]], dtype=torch.float64)
DPPO_OLD = torch.full_like(DPPO_P, 0.5).log()
DPPO_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
DPPO_MASK = torch.ones(1, 5, dtype=torch.float64)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_by_hand(name):
    # TV |p - p_old| = 0.1 (inside 0.15) for tokens 0 and 2, 0.2 (outside) for 1 and 3.
    # Binary KL(0.5 || p) = 0.5 ln(0.5 / p) + 0.5 ln(0.5 / (1 - p)): 0.0204 for p = 0.6 / 0.4
    # (inside 0.05), 0.0872 for 0.7 / 0.3 (outside). Token 4 moved against its advantage: kept.
    loss, grad, metrics = grad_of(name, DPPO_OLD, DPPO_P.log(), DPPO_ADV, DPPO_MASK)
    r = DPPO_P[0] / 0.5  # 1.2, 1.4, 0.8, 0.6, 0.4
    want = (-1.2 * LN(0.6) + 0.8 * LN(0.4) - 0.4 * LN(0.2)) / 5  # -A * sg(r) * log p, inside
    assert loss.item() == pytest.approx(want, abs=1e-7)
    assert metrics["clip_frac"].item() == pytest.approx(2 / 5)
    # REINFORCE-style gradient with a stop-gradient ratio; 0 outside the region
    want_grad = [[-r[0] / 5, 0.0, r[2] / 5, 0.0, -r[4] / 5]]
    assert close(grad, want_grad, tol=1e-7)


def test_dppo_truncates_the_ratio_at_clip_c():
    p = torch.tensor([[0.3]], dtype=torch.float64)  # ratio 30 from p_old 0.01, TV 0.29
    old, adv, mask = torch.tensor([[LN(0.01)]]).double(), -torch.ones(1, 1).double(), p * 0 + 1
    loss, grad, metrics = grad_of("dppo_tv", old, p.log(), adv, mask)  # A < 0, p rose: inside
    assert loss.item() == pytest.approx(20.0 * LN(0.3)) and grad.item() == pytest.approx(20.0)
    assert metrics["truncated_frac"].item() == 1.0
    loss, _, _ = grad_of("dppo_tv", old, p.log(), adv, mask, clip_c=5.0)
    assert loss.item() == pytest.approx(5.0 * LN(0.3))


# ---------------------------------------------------------------- all new losses


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_zero_advantage_zero_gradient_and_padding_ignored(name):
    old, logp, adv, mask = random_case(7)
    kw = {"ppo_kl_coef": 0.0} if name == "kl_cov" else {}  # its KL term needs no advantage
    _, grad, metrics = grad_of(name, old, logp, torch.zeros_like(adv), mask, **kw)
    assert torch.equal(grad, torch.zeros_like(grad))
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    # junk on padding changes nothing
    junk = (1 - mask) * 7.0
    torch.manual_seed(0)
    a, ga, _ = grad_of(name, old - junk, logp + junk, adv + junk, mask)
    torch.manual_seed(0)
    b, gb, _ = grad_of(name, old, logp, adv, mask)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    assert close(ga * mask, gb * mask, tol=1e-12) and torch.equal(ga * (1 - mask), 0 * ga)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_on_policy_gradient_is_the_policy_gradient(name):
    """At ratio 1 every new loss (but GMPO's sequence weighting) is -A grad log pi per token."""
    old, _, adv, mask = random_case(11)
    logp = old.clone()
    # Clip-Cov / KL-Cov: bounds / coefficient that leave every token alone at ratio 1
    kw = {"clip_cov": {"clip_cov_ub": -1.0}, "kl_cov": {"ppo_kl_coef": 0.0}}.get(name, {})
    agg = "seq-mean-token-mean" if name in ("geo_mean", "gmpo") else "token-mean"
    _, grad, _ = grad_of(name, old, logp, adv, mask, agg=agg, **kw)
    if name in ("geo_mean", "gmpo"):  # -mean_t A / |o| / B per token of a row
        lens = mask.sum(-1, keepdim=True)
        seq_adv = (adv * mask).sum(-1, keepdim=True) / lens
        want = -seq_adv / lens / mask.shape[0] * mask
    else:
        want = -adv * mask / mask.sum()
    assert close(grad, want, tol=1e-12)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_rollout_correction_weights_scale_the_loss(name):
    old, logp, adv, mask = random_case(5)
    torch.manual_seed(0)
    base, _ = policy_loss(name, old, logp, adv, mask)
    torch.manual_seed(0)
    doubled, _ = policy_loss(name, old, logp, adv, mask, is_weights=torch.full_like(mask, 2.0))
    assert doubled.item() == pytest.approx(2 * base.item(), rel=1e-9)


class TinyPolicy(torch.nn.Module):
    """log pi(y_t | y_{t-1}): an embedding and a linear head over a vocabulary of 11."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)

    def forward(self, prev, tokens):
        logits = self.head(self.emb(prev))  # (B, T, V)
        return logits.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (B, T)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_two_optimizer_steps_of_a_tiny_policy(name):
    torch.manual_seed(0)
    model = TinyPolicy()
    tokens = torch.randint(0, 11, (4, 6))
    prev = torch.cat([torch.zeros(4, 1, dtype=torch.long), tokens[:, :-1]], dim=1)
    mask = (torch.arange(6)[None] < torch.tensor([6, 4, 5, 2])[:, None]).float()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask
    with torch.no_grad():
        old = model(prev, tokens)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = load_config(None, [f"algo.loss={name}"])
    settled = plan_loss(cfg)
    for _ in range(2):
        # exactly the call grpo.trainer.step.micro_batch_loss makes
        loss, metrics = settled(old, model(prev, tokens), adv, mask, is_weights=None)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
        model.zero_grad()
        loss.backward()
        with torch.no_grad():  # plain SGD by hand: torch.optim's first step imports for seconds
            for p in model.parameters():
                p -= 0.5 * p.grad
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_selectable_through_the_config(name):
    cfg = load_config("configs/gsm8k_grpo.yaml", [f"algo.loss={name}"])
    assert cfg.algo.loss == name
    fn = get_policy_loss(cfg.algo.loss)  # the lookup grpo.plan.check_names makes
    settled = plan_loss(cfg)
    assert settled.fn is fn
    for option in ("agg", "clip_low", "clip_high"):
        # null in the config means the loss's own default: the option is not passed at all
        assert option not in settled.options
        assert own_default(fn, option) == fn.__kwdefaults__.get(option)
    assert settled.agg == (fn.__kwdefaults__.get("agg") or "token-mean")


@pytest.mark.parametrize("name", ["reinforce_pp_baseline", "grpo_passk"])
def test_new_estimators_selectable_through_the_config(name):
    from grpo.algos.registry import get_estimator

    cfg = load_config("configs/gsm8k_grpo.yaml", [f"algo.advantage={name}"])
    assert not get_estimator(cfg.algo.advantage).token_level  # as check_names looks it up


# ---------------------------------------------------------------- REINFORCE++-baseline


def ref_rpp_baseline(rewards, group_size, lengths=None):
    """Group mean removed, then whitened over the batch with each answer weighing its length."""
    n = len(rewards)
    lengths = lengths or [1] * n
    centred = []
    for g in range(0, n, group_size):
        grp = rewards[g : g + group_size]
        mean = sum(grp) / len(grp) if group_size > 1 else 0.0
        centred += [r - mean for r in grp]
    count = sum(lengths)
    mean = sum(c * w for c, w in zip(centred, lengths, strict=True)) / count
    var = sum((c - mean) ** 2 * w for c, w in zip(centred, lengths, strict=True)) / (count - 1)
    return [(c - mean) / math.sqrt(var + 1e-8) for c in centred]


def test_reinforce_pp_baseline_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    # centred: +-0.5 | 0.25, 0.25, 0.25, -0.75; mean 0, unbiased var (1 + 0.1875 + 0.5625) / 7
    # = 0.25 -> divided by 0.5
    want = [1.0, -1.0, -1.0, 1.0, 0.5, 0.5, 0.5, -1.5]
    assert close(reinforce_pp_baseline_advantages(r, 4), want, tol=1e-6)
    assert get_advantage_estimator("reinforce_pp_baseline") is reinforce_pp_baseline_advantages
    # a whole batch of equal rewards: no signal, zeros (not NaN)
    assert torch.equal(reinforce_pp_baseline_advantages(torch.ones(4), 2), torch.zeros(4))


@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_reinforce_pp_baseline_matches_loop(group_size):
    g = torch.Generator().manual_seed(group_size)
    r = torch.randint(0, 4, (6,), generator=g).float() * 0.5
    lengths = [3, 1, 4, 2, 2, 5]
    mask = (torch.arange(5)[None] < torch.tensor(lengths)[:, None]).float()
    assert close(
        reinforce_pp_baseline_advantages(r, group_size), ref_rpp_baseline(r.tolist(), group_size)
    )
    assert close(
        reinforce_pp_baseline_advantages(r, group_size, mask=mask),
        ref_rpp_baseline(r.tolist(), group_size, lengths),
    )


def test_reinforce_pp_baseline_agrees_with_verl():
    # verl's compute_reinforce_plus_plus_baseline_outcome_advantage (verl-project/verl
    # @1dda039) on rewards [1, 0, 0.5 | 0, 2, 1] (two groups of 3), lengths 3, 1, 2, 4, 3, 1
    r = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 1.0])
    mask = (torch.arange(4)[None] < torch.tensor([3, 1, 2, 4, 3, 1])[:, None]).float()
    verl = [0.6373774342480413, -0.6373774342480413, 0.0, -1.2747548684960825,
            1.2747548684960825, 0.0]  # fmt: skip
    assert close(reinforce_pp_baseline_advantages(r, 3, mask=mask), verl, tol=1e-6)


# ---------------------------------------------------------------- GRPO pass@k


def test_grpo_passk_by_hand():
    r = torch.tensor([0.2, 0.9, 0.5, 0.1, 1.0, 1.0, 0.0, 0.0])
    # group 1: best 0.9, second 0.5 -> 0.4 / (unbiased std 0.359398 + 1e-6); others 0
    std = math.sqrt(((0.2 - 0.425) ** 2 + 0.475**2 + 0.075**2 + 0.325**2) / 3)
    want = [0.0, 0.4 / (std + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # group 2: a tie, 0
    assert close(grpo_passk_advantages(r, 4), want)
    assert close(grpo_passk_advantages(r, 4, scale_by_std=False), [0, 0.4, 0, 0, 0, 0, 0, 0])
    assert get_advantage_estimator("grpo_passk") is grpo_passk_advantages
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo_passk_advantages(r, 1)


def test_grpo_passk_matches_loop_and_verl():
    g = torch.Generator().manual_seed(3)
    r = torch.rand(12, generator=g)
    want = []
    for k in range(0, 12, 4):
        grp = [float(x) for x in r[k : k + 4]]
        best = max(range(4), key=grp.__getitem__)
        second = sorted(grp)[-2]
        mean = sum(grp) / 4
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / 3)
        want += [(grp[best] - second) / (std + 1e-6) if i == best else 0.0 for i in range(4)]
    assert close(grpo_passk_advantages(r, 4), want)
    # verl's compute_grpo_passk_outcome_advantage on rewards [1, 0, 0.5 | 0, 2, 1]
    verl = [0.999998000004, 0.0, 0.0, 0.0, 0.9999990000010001, 0.0]
    assert close(grpo_passk_advantages(torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 1.0]), 3), verl)


# ---------------------------------------------------------------- whitening


def test_masked_whiten_conventions():
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1]; population var 2/3
    assert close(masked_whiten(x, mask), [[-1, 0, 1, 0]], tol=1e-7)
    s = math.sqrt(2 / 3)
    assert close(masked_whiten(x, mask, unbiased=False), [[-1 / s, 0, 1 / s, 0]], tol=1e-7)
    # one valid token or none: zeros, not NaN
    one = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(masked_whiten(x, one), torch.zeros_like(x))
    assert torch.equal(masked_whiten(x, 0 * one), torch.zeros_like(x))


def test_reinforce_pp_and_gae_agree_with_verl():
    from grpo.algos import gae, reinforce_pp_advantages

    # verl's compute_reinforce_plus_plus_outcome_advantage (gamma 0.9) and
    # compute_gae_advantage_return (gamma 0.9, lam 0.8), verl-project/verl @1dda039, float64,
    # times the mask
    mask = torch.tensor(VERL_MASK, dtype=torch.float64)
    rewards = torch.tensor(
        [[0.0, 0.5, 0.0, 1.0], [0.2, 0.0, -1.0, 0.0], [0.0, 2.0, 0.0, 0.0]], dtype=torch.float64
    )
    values = torch.tensor(
        [[0.3, 0.1, -0.2, 0.4], [0.5, 0.0, 0.2, 0.0], [-0.1, 0.6, 0.0, 0.0]], dtype=torch.float64
    )
    verl_rpp = [[0.4726335462465891, 0.58561711281427, 0.23200442355664275, 0.3182514209365518],
                [-1.0703252368799843, -1.3204415292817206, -1.4066885266616296, 0.0],
                [1.0082273999758244, 1.1807213947356425, 0.0, 0.0]]  # fmt: skip
    verl_gae = [[0.08718444965026843, 0.5477357246413523, 0.6041440445522511, 0.2213174966805002],
                [-1.138576154800254, -1.0326347672667653, -1.5365595088530495, 0.0],
                [1.2447925532355892, 1.002596165806522, 0.0, 0.0]]  # fmt: skip
    assert close(reinforce_pp_advantages(rewards, mask, gamma=0.9), verl_rpp, tol=1e-7)
    assert close(gae(rewards, values, mask, 0.9, 0.8)[0], verl_gae, tol=1e-7)
    # the population convention, the option, differs from verl's by up to a few 1e-2 here
    # (10 tokens: sqrt(10 / 9) - 1 = 5%)
    pop = reinforce_pp_advantages(rewards, mask, gamma=0.9, unbiased=False)
    assert not close(pop, verl_rpp, tol=1e-3)


def test_an_estimator_declares_what_it_needs():
    """Issue 44: the trainer reads no estimator's signature; what an estimator takes beyond
    its rewards is declared where it registers (GDPO's parts, OPD's log-probs, a token
    estimator's discount by default), and an unknown input is refused there."""
    from grpo.algos.registry import get_estimator, register_advantage_estimator

    with pytest.raises(ValueError, match="may declare"):
        register_advantage_estimator("wants_the_moon", needs=("moon",))
    assert get_estimator("gdpo").needs == ("components",)
    assert get_estimator("opd").needs == ("teacher",)
    assert get_estimator("grpo").needs == () and get_estimator("reinforce_pp").needs == ("gamma",)


def test_the_kl_control_is_built_once_and_adapts_only_when_asked():
    """Issue 44: the in-reward KL coefficient's update is the plan's KlControl, not lines at
    the end of the step: fixed keeps the coefficient; adaptive follows Ziegler et al."""
    from grpo.algos import adaptive_kl_coef
    from grpo.plan import plan_kl_control

    fixed = plan_kl_control(load_config(None, ["algo.kl_in_reward=true"]))
    assert fixed.next(0.1, 5.0, 64) == 0.1 and fixed.next(0.1, None, 64) == 0.1
    adaptive = plan_kl_control(load_config(None, [
        "algo.kl_in_reward=true", "algo.kl_reward_coef=0.1", "algo.kl_ctrl=adaptive",
        "algo.kl_target=0.5", "algo.kl_horizon=1000",
    ]))  # fmt: skip
    assert adaptive.next(0.1, 5.0, 64) == adaptive_kl_coef(0.1, 5.0, 0.5, 1000, 64) > 0.1
    with pytest.raises(ValueError, match="needs the batch's KL"):
        adaptive.next(0.1, None, 64)
