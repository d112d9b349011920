"""The critic's side of PPO: GAE, which turns per-token rewards and the critic's values into
advantages and the critic's regression targets, and the clipped value loss that fits them.

GAE is also the registered token estimator "gae" (`gae_advantages`), which declares the
critic's values among its inputs: the trainer builds a critic for it and whitens its
advantages over the batch's tokens. All tensors are (B, T) and aligned with `mask` (1.0 on
real response tokens, 0 on padding).
"""

import torch
from torch import Tensor

from grpo.algos.advantages import as_float, masked_whiten
from grpo.algos.losses.common import agg_loss, masked_mean
from grpo.algos.registry import register_token_advantage_estimator


def gae(
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    *,
    unbiased: bool = True,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation: (B, T) rewards, values, mask -> (advantages, returns).

    delta_t = r_t + gamma * V_{t'} - V_t and A_t = delta_t + gamma * lam * A_{t'}, right to
    left, where t' is the next valid token (padding is skipped) and V = 0 after the last valid
    token because the episode ends there. returns = raw A + V (the critic's regression
    target); the advantages are then whitened over valid tokens by masked_whiten (unbiased
    variance, eps 1e-8 inside the root: verl's compute_gae_advantage_return; `unbiased=False`
    for the population variance). Both are 0 on padding. Values are treated as constants (no
    gradient).
    """
    with torch.no_grad():
        dtype = torch.promote_types(as_float(token_rewards).dtype, as_float(values).dtype)
        token_rewards, values = token_rewards.to(dtype), values.to(dtype)
        valid = mask > 0  # (B, T)
        adv = torch.zeros_like(values)  # (B, T)
        next_value = torch.zeros_like(values[:, 0])  # (B,), V of the next valid token (0 at end)
        next_adv = torch.zeros_like(values[:, 0])  # (B,)
        for t in reversed(range(values.shape[-1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
            next_adv = torch.where(valid[:, t], delta + gamma * lam * next_adv, next_adv)
            next_value = torch.where(valid[:, t], values[:, t], next_value)
            adv[:, t] = next_adv
        m = mask.to(dtype)
        returns = (adv + values) * m  # (B, T)
        return masked_whiten(adv, mask, eps=1e-8, unbiased=unbiased), returns


@register_token_advantage_estimator("gae", needs=("gamma", "lam", "values"))
def gae_advantages(
    token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float, lam: float
) -> Tensor:
    """GAE's advantages before whitening, (B, T): returns - values on the valid tokens (the
    critic's targets are these plus `values`). The trainer whitens them over the batch's
    tokens, as `gae` whitens over its own."""
    _, returns = gae(token_rewards, values, mask, gamma, lam)
    return (returns - values) * mask


def value_loss(
    values: Tensor,
    returns: Tensor,
    old_values: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss for a critic; all inputs (B, T).

    v_clipped = old_values + clamp(values - old_values, -clip, clip) and
    loss_t = 0.5 * max((values - returns)^2, (v_clipped - returns)^2): like the policy clip,
    the max is pessimistic, so the critic cannot profit from moving further than `clip` from
    its rollout-time prediction. clip=None gives the plain 0.5 * (values - returns)^2.
    Aggregated with agg_loss(..., agg). Metrics (token means over valid tokens):
    vf_clip_frac (the clipped error is the larger one), vf_explained_var
    (1 - Var[returns - values] / (Var[returns] + 1e-8), population variances) and value_mean.
    """
    err = (values - returns).square()  # (B, T)
    if clip is None:
        loss_mat = 0.5 * err
        clipped = torch.zeros_like(mask, dtype=torch.bool)
    else:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0 (or None to disable), got {clip}")
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
        err_clipped = (v_clipped - returns).square()  # (B, T)
        loss_mat = 0.5 * torch.maximum(err, err_clipped)
        clipped = err_clipped > err
    loss = agg_loss(loss_mat, mask, agg)

    with torch.no_grad():
        m = mask.to(values.dtype)
        v, ret = values.detach(), returns.detach()

        def masked_var(x: Tensor) -> Tensor:
            return masked_mean((x - masked_mean(x, m)).square(), m)

        metrics = {
            "vf_clip_frac": masked_mean(clipped.to(m.dtype), m),
            # share of the returns' variance the critic accounts for: 1 is perfect, 0 is no
            # better than predicting the mean, negative is worse than that
            "vf_explained_var": (1.0 - masked_var(ret - v) / (masked_var(ret) + 1e-8)),
            "value_mean": masked_mean(v, m),
        }
    return loss, metrics
