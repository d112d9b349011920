"""Importance weights for the mismatch between the rollout engine and the trainer.

The engine (vLLM) samples with its own kernels, so its log-probs of the sampled tokens differ
slightly from the trainer's for the same weights (and more when the sampler lags behind).
The policy loss is computed against the trainer's old log-probs; weighting each token by
pi_old / pi_rollout corrects for having sampled from pi_rollout instead (truncated
importance sampling, Yao et al. 2025; masked variants as in verl's rollout correction).

All tensors are (B, T) and aligned with `mask`; the weights carry no gradient.
"""

import torch
from torch import Tensor

from grpo.algos.losses.common import clamp_log_ratio, masked_mean
from grpo.core.vocabulary import CORRECTION_MODES


@torch.no_grad()
def rollout_correction_weights(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, threshold: float
) -> tuple[Tensor, dict[str, float]]:
    """Per-token weights (B, T) for the policy loss, and their metrics.

    ratio = pi_old / pi_rollout, per token (token_*) or per answer as the product over its
    tokens (sequence_*, the exact importance weight of the whole answer; every token of the
    answer gets it). *_truncate: weight = min(ratio, threshold) (bounded variance, a little
    bias). *_mask: weight = ratio inside [1 / threshold, threshold], 0 outside (outliers are
    dropped, not shrunk). "none": all ones.

    Metrics: correction_weight_mean (token mean of the weights) and correction_clipped_frac
    (share of tokens, or of answers for sequence_*, whose weight was capped or zeroed).
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {list(CORRECTION_MODES)}")
    m = mask.to(old_logp.dtype)
    if mode == "none":
        return torch.ones_like(old_logp), {}
    if threshold <= 1.0:
        raise ValueError(f"rollout correction threshold must be > 1, got {threshold}")
    log_ratio = (old_logp - rollout_logp) * m  # (B, T), 0 on padding
    level, how = mode.split("_")
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)  # (B, T)
    ratio = clamp_log_ratio(log_ratio).exp()  # e^20 is far past any threshold
    if how == "truncate":
        clipped = ratio > threshold
        weights = ratio.clamp(max=threshold)
    else:
        clipped = (ratio > threshold) | (ratio < 1.0 / threshold)
        weights = torch.where(clipped, torch.zeros_like(ratio), ratio)
    if level == "sequence":  # share of answers (with at least one token), not of tokens
        rows = m.sum(dim=-1) > 0
        frac = (clipped[:, 0] & rows).sum() / rows.sum().clamp(min=1)
    else:
        frac = masked_mean(clipped.to(m.dtype), m)
    metrics = {
        "correction_weight_mean": masked_mean(weights, m).item(),
        "correction_clipped_frac": float(frac),
    }
    return weights * m, metrics


@torch.no_grad()
def logp_abs_diff(a: Tensor, b: Tensor, mask: Tensor) -> float:
    """Mean |a - b| over valid tokens: how far two log-prob computations of the same tokens
    disagree (the rollout_vs_old_logp_abs_diff metric)."""
    return masked_mean((a - b).abs(), mask.to(a.dtype)).item()
