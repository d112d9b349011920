"""The entropy-mechanism losses (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models", arXiv:2505.22617, Sec. 4): Clip-Cov and KL-Cov.

The entropy change of a softmax policy follows -Cov(log pi(y), A) (the paper's entropy
dynamics), so tokens with a large positive centred product
Cov_t = (A_t - mean A) * (log pi_t - mean log pi) (means over the valid tokens) are the ones
collapsing the entropy. Both losses single a few of them out: Clip-Cov takes their gradient
away, KL-Cov holds them near the old policy.
"""

import torch
from torch import Tensor

from grpo.algos.losses.clipped import pessimistic_surrogate
from grpo.algos.losses.common import (
    masked_mean,
    ratio_metrics,
    token_advantages,
    token_log_ratio,
    token_ratio,
    weighted_agg,
)
from grpo.algos.registry import register_policy_loss


@torch.no_grad()
def _token_covariance(adv: Tensor, logp: Tensor, m: Tensor) -> Tensor:
    """Cov_t = (A_t - mean A) * (log pi_t - mean log pi), means over valid tokens: (B, T)."""
    a, lp = adv.expand_as(logp), logp.detach()
    return (a - masked_mean(a, m)) * (lp - masked_mean(lp, m))  # (B, T)


def _clip_cov_choice(candidates: Tensor, n_clip: int) -> Tensor:
    """A (B, T) bool mask of n_clip of the True entries of `candidates`, chosen uniformly at
    random (all of them if there are fewer). Row-major candidates and torch.randperm on the
    default CPU generator, as verl does, so the same seed chooses the same tokens."""
    idx = torch.nonzero(candidates)  # (K, 2)
    chosen = torch.zeros_like(candidates)
    if len(idx):
        idx = idx[torch.randperm(len(idx))[: min(n_clip, len(idx))].to(idx.device)]
        chosen[idx[:, 0], idx[:, 1]] = True
    return chosen


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (arXiv:2505.22617, Sec. 4): no gradient for a few high-covariance tokens.

    Among the valid tokens that PPO's clip does not already clip and whose Cov_t lies in
    (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio * n_valid)) are drawn at random and
    get no loss (hence no gradient); every other token has PPO's clipped loss
    max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)). Defaults: verl's (ratio 2e-4,
    bounds (1, 5), clip 0.2, token-mean). Matches verl's `clip_cov` (same draw with the same
    torch seed: torch.randperm on the CPU generator); log-ratios are clamped to +-20 first,
    which verl does not. The choice syncs with the GPU once (the count of candidates).
    Metrics: clip_frac (PPO's clip), cov_clip_frac (tokens detached), approx_kl, ratio_mean.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    adv = token_advantages(advantages)  # (B, T) or (B, 1)
    m = mask.to(logp.dtype)  # (B, T)
    valid = mask > 0  # (B, T)
    ratio = token_ratio(old_logp, logp)  # (B, T)
    loss_mat, clipped = pessimistic_surrogate(ratio, adv, clip_low, clip_high)  # (B, T)
    ppo_clipped = clipped & valid  # (B, T)
    with torch.no_grad():
        cov = _token_covariance(adv, logp, m)  # (B, T)
        candidates = valid & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        n_clip = max(int(clip_cov_ratio * float(m.sum())), 1)
        detached = _clip_cov_choice(candidates, n_clip)  # (B, T)
    loss_mat = loss_mat.masked_fill(detached, 0.0)  # (B, T)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean(ppo_clipped.to(m.dtype), m),
            "cov_clip_frac": masked_mean(detached.to(m.dtype), m),
        }
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (arXiv:2505.22617, Sec. 4): a KL penalty on the highest-covariance tokens.

    Unclipped surrogate -A r for every token, plus ppo_kl_coef * |log r| on the top
    max(1, int(kl_cov_ratio * n_valid)) valid tokens by Cov_t: the tokens that drive the
    entropy down are held near the old policy instead of being cut off. No ratio clip at all
    (clip_low / clip_high are not taken). Defaults: verl's configured ones (kl_cov_ratio 2e-4,
    ppo_kl_coef 0.1; its code falls back to 1.0 only when the key is null), token-mean.
    Matches verl's `kl_cov` (ties in Cov may pick different tokens); log-ratios are clamped to
    +-20 first, which verl does not. The choice syncs with the GPU once (the token count).
    Metrics: kl_cov_frac (tokens penalised), approx_kl, ratio_mean.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    adv = token_advantages(advantages)  # (B, T) or (B, 1)
    m = mask.to(logp.dtype)  # (B, T)
    valid = mask > 0  # (B, T)
    log_r = token_log_ratio(old_logp, logp)  # (B, T)
    ratio = torch.exp(log_r)  # (B, T)
    with torch.no_grad():
        cov = _token_covariance(adv, logp, m)  # (B, T)
        n_valid = int(valid.sum())
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if n_valid:
            k = max(1, int(n_valid * kl_cov_ratio))
            top = cov.masked_fill(~valid, -torch.inf).flatten().topk(k).indices  # (k,)
            penalised[top] = True
        penalised = penalised.view_as(valid)  # (B, T)
    loss_mat = -adv * ratio + ppo_kl_coef * log_r.abs() * penalised  # (B, T)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)
    with torch.no_grad():
        metrics = {"kl_cov_frac": masked_mean(penalised.to(m.dtype), m)}
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)
