"""What every policy loss shares: the importance ratio, token aggregation, the KL estimators,
the metrics, and the PolicyLoss contract that each registered loss follows.

All tensors are (B, T) and aligned with `mask` (1.0 on real response tokens, 0 on padding).
"""

from typing import Any, Protocol

import torch
from torch import Tensor

from grpo.algos.registry import get_policy_loss
from grpo.core.vocabulary import AGG_MODES, KL_KINDS

# exp() of a log-ratio above ~88 overflows float32; anything past e^20 is already saturated by
# any clip or threshold, so clamping the exponent only removes inf/NaN, never real signal.
MAX_LOG_RATIO = 20.0


class PolicyLoss(Protocol):
    """The calling convention of a policy loss (grpo.algos.registry.register_policy_loss):

    `fn(old_logp, logp, advantages, mask, *, agg, clip_low, clip_high, clip_c, is_weights, ...)
    -> (loss, metrics)`.

    old_logp, logp, mask: (B, T); logp carries the gradient. advantages: (B, T), or (B,) for
    one per sequence. The options are keywords: agg (one of AGG_MODES), clip_low and
    clip_high (the trust region, [1 - clip_low, 1 + clip_high] for a ratio clip), clip_c (a
    dual clip or a truncation cap), is_weights ((B, T), no gradient: the rollout correction's
    importance weights, grpo.algos.correction), then hyper-parameters the config has no key
    for. A loss takes only the options it uses, and its keyword defaults are its own defaults,
    written nowhere else: the trainer and the config read the signature to find what `null`
    means and to refuse an option the loss does not take, and policy_loss passes only the
    options that are set. `**options` below stands for that per-loss set of keywords, which
    a Protocol cannot spell.

    loss: a scalar to backprop. metrics: 0-d tensors without grad, on the inputs' device (the
    caller turns them into numbers once per step: a `.item()` here would wait for the GPU
    after every micro-batch), plain token means over valid tokens whatever the loss's `agg`,
    so runs with different aggregations stay comparable.
    """

    def __call__(
        self, old_logp: Tensor, logp: Tensor, advantages: Tensor, mask: Tensor, /, **options: Any
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


def clamp_log_ratio(log_ratio: Tensor) -> Tensor:
    """A log-ratio clamped to +-MAX_LOG_RATIO, so that its exp() stays finite."""
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def token_log_ratio(old_logp: Tensor, logp: Tensor) -> Tensor:
    """log(pi / pi_old) per token, clamped: (B, T), (B, T) -> (B, T)."""
    return clamp_log_ratio(logp - old_logp)


def token_ratio(old_logp: Tensor, logp: Tensor) -> Tensor:
    """The importance ratio pi / pi_old per token, its log clamped: (B, T) -> (B, T)."""
    return torch.exp(token_log_ratio(old_logp, logp))


def clip_ratio(ratio: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """The ratio clipped to PPO's trust region [1 - clip_low, 1 + clip_high]."""
    return ratio.clamp(1.0 - clip_low, 1.0 + clip_high)


def token_advantages(advantages: Tensor) -> Tensor:
    """Sequence-level advantages (B,) -> (B, 1), broadcasting over tokens; (B, T) unchanged."""
    return advantages[:, None] if advantages.dim() == 1 else advantages


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


def weighted_agg(loss_mat: Tensor, mask: Tensor, agg: str, is_weights: Tensor | None) -> Tensor:
    """agg_loss of the per-token losses (B, T), each first scaled by its weight (no gradient)
    when `is_weights` is given: the rollout correction's importance weights
    (grpo.algos.correction)."""
    if is_weights is not None:
        loss_mat = loss_mat * is_weights.detach()
    return agg_loss(loss_mat, mask, agg)


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
        log_r = clamp_log_ratio(ref_logp - logp)
        return (torch.exp(log_r) - log_r - 1).clamp(-10.0, 10.0)
    if kind == "abs":
        return (logp - ref_logp).abs()
    raise ValueError(f"unknown KL penalty {kind!r}; valid: {list(KL_KINDS)}")


def ratio_metrics(old_logp: Tensor, logp: Tensor, ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """The metrics every ratio-based loss reports (no grad), token means over valid tokens:
    approx_kl, the k3 estimate of KL(pi_old || pi) on tokens sampled from pi_old
    (exp(logp - old) - (logp - old) - 1: >= 0, low variance), and ratio_mean."""
    with torch.no_grad():
        return {
            "approx_kl": masked_mean(kl_penalty(old_logp, logp.detach(), "k3"), m),
            "ratio_mean": masked_mean(ratio.detach(), m),
        }


def policy_loss(
    name: str,
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dispatch to the policy loss `name` (registered, or `package.module:function`).

    `options` (agg, clip_low, clip_high, clip_c, is_weights) are passed only when not None, so
    that the loss's own defaults (its signature's) apply otherwise; a
    user's loss need not take the ones it has no use for.
    """
    given = {k: v for k, v in options.items() if v is not None}
    return get_policy_loss(name)(old_logp, logp, advantages, mask, **given)
