"""Clipped surrogates: losses of the importance ratio r = pi / pi_old itself (the gradient
flows through r), kept from profiting by moving r past a trust region.

PPO/GRPO clip the token ratio (with an optional dual clip), GSPO a sequence-level ratio, GMPO
the token log-ratios inside a geometric mean, and SAPO replaces the hard clip by a soft gate.
"""

import torch
from torch import Tensor

from grpo.algos.losses.common import (
    agg_loss,
    clamp_log_ratio,
    clip_ratio,
    masked_mean,
    ratio_metrics,
    token_advantages,
    token_log_ratio,
    token_ratio,
    weighted_agg,
)
from grpo.algos.registry import register_policy_loss


def pessimistic_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's per-token loss max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) (B, T), and
    where the clipped term is the larger (B, T, bool). `advantages` (B, T) or (B, 1).

    The max of the two losses is the min of the two objectives: never profit from moving the
    ratio outside [1 - clip_low, 1 + clip_high] in the direction the advantage rewards.
    """
    pg = -advantages * ratio  # (B, T)
    pg_clipped = -advantages * clip_ratio(ratio, clip_low, clip_high)  # (B, T)
    return torch.maximum(pg, pg_clipped), pg_clipped > pg


def _clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    logp: Tensor,
    *,
    agg: str,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    is_weights: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO pessimistic surrogate on an importance ratio (B, T), shared by PPO and GSPO.

    `is_weights` (B, T), without gradient, scale each token's loss before aggregation: the
    rollout correction's importance weights (grpo.algos.correction)."""
    advantages = token_advantages(advantages)  # sequence-level (B,) are fine too
    loss_mat, clipped = pessimistic_surrogate(ratio, advantages, clip_low, clip_high)  # (B, T)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_c is not None:
        if clip_c <= 1.0:
            raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
        # For A < 0 the pessimistic loss -A*ratio grows without bound as the ratio grows
        # (a token the old policy rarely sampled); dual clip caps it at -A*clip_c (Ye et al. 2020).
        cap = -advantages * clip_c
        dual_clipped = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(dual_clipped, cap, loss_mat)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)

    with torch.no_grad():
        m = mask.to(ratio.dtype)
        metrics = {
            "clip_frac": masked_mean(clipped.to(m.dtype), m),
            "dual_clip_frac": masked_mean(dual_clipped.to(m.dtype), m),
        }
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("ppo")
@register_policy_loss("grpo")
def ppo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level clipped surrogate (PPO, as used by GRPO/DAPO).

    ratio_t = pi(y_t) / pi_old(y_t); clip_high > clip_low is DAPO's "clip-higher", which lets
    low-probability tokens grow faster and keeps entropy from collapsing.
    """
    return _clipped_surrogate(
        token_ratio(old_logp, logp),
        advantages,
        mask,
        old_logp,
        logp,
        agg=agg,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        is_weights=is_weights,
    )


@register_policy_loss("gspo")
def gspo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    clip_c: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): clip a sequence-level ratio instead of token ratios.

    s_i = exp(mean_t (logp_t - old_logp_t)), the geometric mean of the token ratios: length
    normalised, so its scale does not depend on response length and its clip range is tiny.
    Applied per token as s_it = sg[s_i] * exp(logp_t - sg[logp_t]): its value is s_i but
    d s_it / d logp_t = s_i, so each token gets the sequence's weight with its own gradient
    path. With seq-mean-token-mean this reproduces the paper's gradient exactly
    (d s_i / d logp_t = s_i / |y_i|). The token form also allows token-level advantages.
    The keyword defaults are the paper's, and the only place GSPO's defaults are written (a
    null clip or agg in the config means them).
    """
    mask_f = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * mask_f  # (B, T), zero on padding
    seq_log_ratio = log_ratio.sum(dim=-1) / mask_f.sum(dim=-1).clamp(min=1)  # (B,)
    log_s = seq_log_ratio.detach()[:, None] + logp - logp.detach()  # (B, T), value = seq ratio
    ratio = torch.exp(clamp_log_ratio(log_s))  # (B, T)
    return _clipped_surrogate(
        ratio,
        advantages,
        mask,
        old_logp,
        logp,
        agg=agg,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=clip_c,
        is_weights=is_weights,
    )


@register_policy_loss("sapo")
def sapo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347): a soft gate, no hard clip.

    J = mean_i 1/|y_i| sum_t f(r_it) * A_it with the gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau
    (the paper's objective and gating function), tau = tau_pos where A > 0, else tau_neg.
    f(1) = 2 / tau and f'(r) = 4 s (1 - s) with s = sigmoid(tau * (r - 1)): at r = 1 the
    gradient is exactly the policy gradient, and it fades smoothly (instead of dropping to 0
    at a clip boundary) as the ratio moves away; tau_neg > tau_pos damps negative updates
    faster, which the paper finds more stable. Defaults: the paper's (and verl's) tau_pos 1.0,
    tau_neg 1.05, and seq-mean-token-mean (verl always uses it for `sapo`, whatever its
    loss_agg_mode; here `agg` can change it). Matches verl's `sapo` on the same inputs.
    Metrics: gate_weight_mean (4 s (1 - s), the share of the unclipped gradient A * r * grad
    log pi that a token keeps; 1 on policy), approx_kl, ratio_mean.
    """
    adv = token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = token_ratio(old_logp, logp)  # (B, T)
    tau = torch.where(adv > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))  # (B, T)
    s = torch.sigmoid(tau * (ratio - 1.0))  # (B, T)
    loss_mat = -(s * (4.0 / tau)) * adv  # (B, T)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        metrics = {"gate_weight_mean": masked_mean(4.0 * s * (1.0 - s), m)}
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("geo_mean")
@register_policy_loss("gmpo")
def geo_mean_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Geometric-Mean Policy Optimization, arXiv:2507.20673): geometric mean of token ratios.

    J_i = A_i * exp(1/|o_i| sum_t sgn(A_it) * min(sgn(A_it) * log r_it,
    sgn(A_it) * clip(log r_it, -clip_low, clip_high))) (the paper's GMPO objective, token-level
    clipping in log space): the product of the token ratios to the power 1/|o_i|, so one
    outlier ratio moves the sequence's weight far less than in GRPO's arithmetic mean. The
    clip bounds are on the log-ratio, not on the ratio; the min is PPO's pessimism (a positive
    advantage cannot profit from log r > clip_high, a negative one from log r < -clip_low).
    A_i is the sequence's mean token advantage. Each sequence's loss -J_i is given to all its
    tokens, so the default seq-mean-token-mean is the mean over sequences of -J_i (verl's
    `geo_mean`, which ignores loss_agg_mode); token-mean would weigh sequences by length.
    Defaults: the paper's range (e^-0.4, e^0.4), clip_low = clip_high = 0.4 (verl's GMPO
    example; verl's generic default would be 0.2). `is_weights` enter per sequence as their
    geometric mean, as in verl. Matches verl's `geo_mean` except that log-ratios are clamped
    to +-20 first (verl leaves that clamp commented out; it matters only past e^20).
    Metrics: clip_frac (tokens whose clipped log-ratio was the one used), approx_kl,
    ratio_mean (of the sequence ratios, per token).
    """
    m = mask.to(logp.dtype)  # (B, T)
    adv = token_advantages(advantages).expand_as(logp)  # (B, T)
    log_r = token_log_ratio(old_logp, logp)  # (B, T)
    sign = torch.sign(adv)  # (B, T)
    log_r_clipped = log_r.clamp(-clip_low, clip_high)  # (B, T)
    log_r_used = sign * torch.minimum(sign * log_r, sign * log_r_clipped)  # (B, T)
    length = m.sum(dim=-1).clamp(min=1)  # (B,)
    seq_ratio = torch.exp((log_r_used * m).sum(dim=-1) / length)  # (B,)
    seq_adv = (adv * m).sum(dim=-1) / length  # (B,)
    seq_loss = -seq_adv * seq_ratio  # (B,)
    if is_weights is not None:
        log_w = torch.log(is_weights.detach() + 1e-10)  # (B, T)
        seq_loss = seq_loss * torch.exp((log_w * m).sum(dim=-1) / length)
    loss = agg_loss(seq_loss[:, None].expand_as(logp), mask, agg)
    with torch.no_grad():
        used_clip = (log_r_used != log_r) & (sign != 0)  # (B, T)
        metrics = {"clip_frac": masked_mean(used_clip.to(m.dtype), m)}
    return loss, metrics | ratio_metrics(old_logp, logp, seq_ratio[:, None].expand_as(m), m)
