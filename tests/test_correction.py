"""Rollout correction weights and their use in the policy losses."""

import math

import pytest
import torch

from grpo.algos import logp_abs_diff, policy_loss, rollout_correction_weights

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def logs(*ratios_rows):
    """old, rollout log-probs whose token ratios old/rollout are the given values."""
    rollout = torch.full((len(ratios_rows), 3), -1.0)
    old = rollout + torch.tensor(ratios_rows).log()
    return old, rollout


def test_none_gives_ones_and_no_metrics():
    old, rollout = logs([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    w, metrics = rollout_correction_weights(old, rollout, MASK, "none", 2.0)
    assert torch.equal(w, torch.ones_like(w)) and metrics == {}


def test_token_truncate_caps_each_token():
    old, rollout = logs([0.5, 1.5, 4.0], [1.0, 3.0, 9.0])
    w, m = rollout_correction_weights(old, rollout, MASK, "token_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[0.5, 1.5, 2.0], [1.0, 2.0, 0.0]]))
    assert m["correction_clipped_frac"] == pytest.approx(2 / 5)
    assert m["correction_weight_mean"] == pytest.approx((0.5 + 1.5 + 2 + 1 + 2) / 5)


def test_token_mask_drops_tokens_outside_the_band():
    old, rollout = logs([0.4, 1.5, 4.0], [1.0, 0.6, 9.0])
    w, m = rollout_correction_weights(old, rollout, MASK, "token_mask", 2.0)
    assert torch.allclose(w, torch.tensor([[0.0, 1.5, 0.0], [1.0, 0.6, 0.0]]))
    assert m["correction_clipped_frac"] == pytest.approx(2 / 5)


def test_sequence_modes_use_the_product_over_the_answer():
    old, rollout = logs([1.5, 1.5, 1.0], [0.9, 1.0, 123.0])  # padding ignored: 0.9, not 110
    w, m = rollout_correction_weights(old, rollout, MASK, "sequence_truncate", 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2.0, 2.0], [0.9, 0.9, 0.0]]))
    assert m["correction_clipped_frac"] == pytest.approx(1 / 2)  # of answers
    w, m = rollout_correction_weights(old, rollout, MASK, "sequence_mask", 2.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 0.0], [0.9, 0.9, 0.0]]))


def test_bad_mode_and_threshold_are_refused():
    old, rollout = logs([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rollout_correction_weights(old, rollout, MASK, "token_clip", 2.0)
    with pytest.raises(ValueError, match="threshold"):
        rollout_correction_weights(old, rollout, MASK, "token_mask", 1.0)


def test_huge_ratios_stay_finite():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    rollout = torch.tensor([[-500.0, 0.0, 0.0]])
    for mode in ("token_truncate", "sequence_truncate", "token_mask", "sequence_mask"):
        w, _ = rollout_correction_weights(old, rollout, torch.ones(1, 3), mode, 3.0)
        assert torch.isfinite(w).all()


def test_abs_diff_ignores_padding():
    a = torch.tensor([[0.0, -1.0, 5.0]])
    b = torch.tensor([[0.5, -1.5, -5.0]])
    assert logp_abs_diff(a, b, torch.tensor([[1.0, 1.0, 0.0]])) == pytest.approx(0.5)


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
def test_weights_scale_the_token_losses(loss):
    torch.manual_seed(0)
    old = -torch.rand(2, 3)
    logp = (old + 0.01 * torch.randn(2, 3)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    args = dict(agg="token-mean", clip_low=0.2, clip_high=0.2)
    plain, _ = policy_loss(loss, old, logp, adv, MASK, **args)
    ones, _ = policy_loss(loss, old, logp, adv, MASK, is_weights=torch.ones(2, 3), **args)
    assert torch.allclose(plain, ones)
    w = torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]])
    weighted, _ = policy_loss(loss, old, logp, adv, MASK, is_weights=w, **args)
    only_first, _ = policy_loss(loss, old, logp, adv, MASK * torch.tensor([[1.0], [0.0]]), **args)
    # row 2 weighs nothing and row 1 twice; token-mean still divides by all 5 tokens
    assert weighted.item() == pytest.approx(2 * only_first.item() * 3 / 5, rel=1e-5)
    assert math.isfinite(weighted.item())
