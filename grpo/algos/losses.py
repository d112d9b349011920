"""Loss aggregation, KL penalties, clipped policy-gradient losses (PPO/GRPO, GSPO) and the
clipped value loss for a critic.

All tensors are (B, T) and aligned with `mask` (1.0 on real response tokens, 0 on padding).
Every policy loss returns `(loss, metrics)`: a scalar tensor to backprop and a dict of 0-d
tensors computed without grad, on the inputs' device (the caller turns them into numbers once
per step: a `.item()` here would wait for the GPU after every micro-batch). Metrics are always
plain token means over valid tokens, whatever aggregation the loss itself uses, so runs with
different `agg` stay comparable.
"""

import torch
from torch import Tensor

from grpo.algos.registry import get_policy_loss, register_policy_loss

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# exp() of a log-ratio above ~88 overflows float32; anything past e^20 is already saturated by
# the clip, so clamping the exponent only removes inf/NaN, never real signal.
_MAX_LOG_RATIO = 20.0


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over valid tokens: (B, T), (B, T) -> scalar. 0 if nothing is valid."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar.

    token-mean:              sum of all valid tokens / number of valid tokens. Long and short
                             answers weigh the same per token (DAPO).
    seq-mean-token-sum:      per sequence sum over tokens, then mean over the B sequences.
    seq-mean-token-mean:     per sequence mean over tokens, then mean over sequences (original
                             GRPO); every sequence weighs the same, whatever its length.
    seq-mean-token-sum-norm: per sequence sum divided by the constant T (max response length),
                             then mean over sequences (Dr. GRPO): removes the length bias of
                             seq-mean-token-mean without making the scale depend on the batch.
    The seq-mean-* modes average over all B rows, including rows with no valid token (these
    contribute 0). Denominators are clamped to >= 1 so an empty mask gives 0, not NaN.
    """
    mask = mask.to(loss_mat.dtype)
    masked = loss_mat * mask  # (B, T)
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (masked.sum(dim=-1) / max(mask.shape[-1], 1)).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {list(AGG_MODES)}")


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi: (B, T) -> (B, T).

    k1:  logp - ref_logp                       unbiased, high variance, can be negative.
    k2:  0.5 * (logp - ref_logp)^2             biased, low variance, >= 0.
    k3:  exp(ref - logp) - (ref - logp) - 1    unbiased and >= 0 (Schulman's estimator, used
                                               by GRPO); clamped to [-10, 10] because the exp
                                               explodes when pi puts much less mass than ref.
    abs: |logp - ref_logp|
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp).square()
    if kind == "k3":
        log_r = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return (torch.exp(log_r) - log_r - 1).clamp(-10.0, 10.0)
    if kind == "abs":
        return (logp - ref_logp).abs()
    raise ValueError(f"unknown KL penalty {kind!r}; valid: ['k1', 'k2', 'k3', 'abs']")


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
    weights: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO pessimistic surrogate on an importance ratio (B, T), shared by PPO and GSPO.

    `weights` (B, T), without gradient, scale each token's loss before aggregation: the
    rollout correction's importance weights (grpo.algos.correction)."""
    if advantages.dim() == 1:  # sequence-level advantages (B,) are fine too
        advantages = advantages[:, None]
    pg = -advantages * ratio  # (B, T)
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    # max of the two losses = min of the two objectives: never profit from moving the ratio
    # outside [1 - clip_low, 1 + clip_high] in the direction the advantage rewards.
    loss_mat = torch.maximum(pg, pg_clipped)  # (B, T)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_c is not None:
        if clip_c <= 1.0:
            raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
        # For A < 0 the pessimistic loss -A*ratio grows without bound as the ratio grows
        # (a token the old policy rarely sampled); dual clip caps it at -A*clip_c (Ye et al. 2020).
        cap = -advantages * clip_c
        dual_clipped = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(dual_clipped, cap, loss_mat)
    if weights is not None:
        loss_mat = loss_mat * weights.detach()
    loss = agg_loss(loss_mat, mask, agg)

    with torch.no_grad():
        m = mask.to(ratio.dtype)
        metrics = {
            "clip_frac": masked_mean((pg_clipped > pg).to(m.dtype), m),
            "dual_clip_frac": masked_mean(dual_clipped.to(m.dtype), m),
            # k3 estimate of KL(pi_old || pi) between rollout and current policy, on tokens
            # sampled from pi_old: exp(logp - old) - (logp - old) - 1. >= 0, low variance.
            "approx_kl": masked_mean(kl_penalty(old_logp, logp, "k3"), m),
            "ratio_mean": masked_mean(ratio, m),
        }
    return loss, metrics


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
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level clipped surrogate (PPO, as used by GRPO/DAPO).

    ratio_t = pi(y_t) / pi_old(y_t); clip_high > clip_low is DAPO's "clip-higher", which lets
    low-probability tokens grow faster and keeps entropy from collapsing.
    """
    log_ratio = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    return _clipped_surrogate(
        ratio, advantages, mask, old_logp, logp,
        agg=agg, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, weights=weights,
    )  # fmt: skip


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
    weights: Tensor | None = None,
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
    ratio = torch.exp(log_s.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    return _clipped_surrogate(
        ratio, advantages, mask, old_logp, logp,
        agg=agg, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, weights=weights,
    )  # fmt: skip


def policy_loss(
    name: str,
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dispatch to the policy loss `name` (registered, or `package.module:function`).

    `options` (agg, clip_low, clip_high, clip_c, weights) are passed only when not None, so
    that the loss's own defaults (its signature's) apply otherwise; a
    user's loss need not take the ones it has no use for.
    """
    given = {k: v for k, v in options.items() if v is not None}
    return get_policy_loss(name)(old_logp, logp, advantages, mask, **given)


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
