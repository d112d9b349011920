"""Importance weights and rejection masks for the mismatch between the rollout engine and the
trainer.

The engine (vLLM) samples with its own kernels, so its log-probs of the sampled tokens differ
slightly from the trainer's for the same weights (and more when the sampler lags behind).
The policy loss is computed against the trainer's old log-probs; weighting each token by
pi_old / pi_rollout corrects for having sampled from pi_rollout instead (truncated
importance sampling, Yao et al. 2025; masked variants as in verl's rollout correction).
IcePop (Ring-1T, 2025) keeps a token's ratio as its weight inside a band and gives it 0
outside. Decoupled PPO (AReaL, Fu et al. 2025) reads the old log-probs as the proximal policy
of its clip and weighs each token by pi_prox / pi_behav, pi_behav being the weights that
sampled that very token (with continuous generation one answer's tokens come from several
versions, each with its own rollout log-prob); a weight above the cap is 0, not capped.
Rejection masks go further: tokens or whole answers whose ratio leaves a band get
weight 0, so no gradient (Geo-RS, the token-outlier veto...), on top of any weight mode.

All tensors are (B, T) and aligned with `mask`; the weights carry no gradient. The bands are
compared in log space, so a ratio of e^500 neither overflows nor slips through.
"""

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from grpo.algos.losses.common import clamp_log_ratio, masked_mean
from grpo.core.vocabulary import BANDED_MODES, REJECTION_MASKS, parse_correction

Band = tuple[float, float]


@torch.no_grad()
def rollout_correction_weights(
    old_logp: Tensor,
    rollout_logp: Tensor,
    mask: Tensor,
    mode: str,
    threshold: float,
    bands: Mapping[str, Band] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token weights (B, T) for the policy loss, and their metrics.

    `mode` is one weight mode and / or rejection masks joined by '+' (grpo.core.vocabulary.
    parse_correction), e.g. "token_truncate", "icepop+geo_rs", "token_truncate+token_reject".

    Weight modes, from ratio = pi_old / pi_rollout per token (token_*) or per answer as the
    product over its tokens (sequence_*, the exact importance weight of the whole answer;
    every token of the answer gets it). *_truncate: weight = min(ratio, threshold) (bounded
    variance, a little bias). *_mask: weight = ratio inside [1 / threshold, threshold], 0
    outside (outliers are dropped, not shrunk). icepop: weight = ratio inside
    bands["icepop"], 0 outside (no threshold). seq_masked_tis: sequence_truncate's weight,
    and 0 for answers whose product ratio leaves bands["seq_masked_tis"] (verl's Seq-MIS).
    decoupled: AReaL's decoupled PPO, weight = the token's ratio pi_prox / pi_behav (old_logp
    being the proximal policy, rollout_logp each token's behaviour log-prob) when at most
    `threshold` (AReaL's behav_imp_weight_cap), 0 above it (no lower bound); its zeros stay in
    the token-mean denominator, as in AReaL's loss.

    Rejection masks, each with its band [low, high] from `bands`: token_reject zeroes the
    tokens whose ratio leaves it; geo_rs zeroes answers whose geometric mean of token ratios leaves
    it (length-independent, unlike the product); token_outlier zeroes answers with any token
    ratio outside it (verl's veto). Masks multiply each other and the weight mode's weights.

    Metrics: correction_weight_mean (token mean of the final weights) and, for the modes with
    a threshold, correction_clipped_frac (share of tokens, or of answers for sequence_*, whose
    weight was capped or zeroed by it); per band (icepop's and seq_masked_tis's included),
    correction_<name>_token_frac and correction_<name>_seq_frac, the share of tokens and of
    answers it masked; with any band, correction_masked_token_frac and
    correction_masked_seq_frac for all of them together.
    """
    weight_mode, masks = parse_correction(mode)
    m = mask.to(old_logp.dtype)
    if weight_mode == "none" and not masks:
        return torch.ones_like(old_logp), {}
    log_ratio = (old_logp - rollout_logp) * m  # (B, T), 0 on padding
    weights, metrics = torch.ones_like(m), {}
    if weight_mode != "none":
        weights, metrics = _mode_weights(log_ratio, m, weight_mode, threshold)
    banded = masks + ((weight_mode,) if weight_mode in BANDED_MODES else ())
    keep = torch.ones_like(m)
    for name in banded:
        kept = band_keep(name, log_ratio, m, _band(bands, name))
        metrics |= masked_shares(f"correction_{name}", kept, m)
        keep = keep * kept
    if banded:
        metrics |= masked_shares("correction_masked", keep, m)
    weights = weights * keep * m
    if weight_mode != "none":
        metrics["correction_weight_mean"] = masked_mean(weights, m).item()
    return weights, metrics


@torch.no_grad()
def rollout_rejection(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, mode: str, bands: Mapping[str, Band]
) -> Tensor:
    """(B, T) 0 on the tokens `mode`'s rejections drop (its masks, and seq_masked_tis's band),
    1 elsewhere. The trainer takes them out of the loss mask, as verl takes them out of its
    response_mask: no policy gradient, no KL or entropy term, no place in the token-mean
    denominator. IcePop's and *_mask's zeros are weights (verl's rollout_is), not rejections:
    they stay in the denominator."""
    weight_mode, masks = parse_correction(mode)
    m = mask.to(old_logp.dtype)
    log_ratio = (old_logp - rollout_logp) * m
    keep = torch.ones_like(m)
    for name in masks + (("seq_masked_tis",) if weight_mode == "seq_masked_tis" else ()):
        keep = keep * band_keep(name, log_ratio, m, _band(bands, name))
    return keep


def _band(bands: Mapping[str, Band] | None, name: str) -> Band:
    """The [low, high] of `name`, checked: 0 < low < high, both finite."""
    if bands is None or name not in bands:
        raise ValueError(f"rollout correction {name!r} needs its band [low, high]")
    low, high = bands[name]
    if not 0 < low < high or not math.isfinite(high):
        raise ValueError(f"rollout correction {name!r}: band needs 0 < low < high, got {low, high}")
    return float(low), float(high)


def band_keep(name: str, log_ratio: Tensor, m: Tensor, band: Band) -> Tensor:
    """(B, T) 1.0 where `name`'s statistic of log_ratio (0 on padding) lies in `band`, else 0.

    icepop, token_reject: each token's own ratio; geo_rs: exp(mean of the answer's log-ratios);
    seq_masked_tis: exp(their sum), the answer's importance weight; token_outlier: every token
    of the answer in the band. Padding is 1 (the caller multiplies by the mask)."""
    low, high = math.log(band[0]), math.log(band[1])
    if name in ("icepop", "token_reject"):
        inside = (log_ratio >= low) & (log_ratio <= high)
        return torch.where(m > 0, inside, True).to(m.dtype)
    if name == "token_outlier":
        outside = ((log_ratio < low) | (log_ratio > high)) & (m > 0)
        return (~outside.any(dim=-1, keepdim=True)).expand_as(m).to(m.dtype)
    total = log_ratio.sum(dim=-1, keepdim=True)  # (B, 1)
    if name == "geo_rs":
        total = total / m.sum(dim=-1, keepdim=True).clamp(min=1)
    elif name != "seq_masked_tis":
        raise ValueError(f"unknown rejection mask {name!r}; valid: {list(REJECTION_MASKS)}")
    return ((total >= low) & (total <= high)).expand_as(m).to(m.dtype)


def masked_shares(prefix: str, keep: Tensor, m: Tensor) -> dict[str, float]:
    """{prefix}_token_frac: share of valid tokens with keep 0; {prefix}_seq_frac: share of
    answers (with at least one valid token) that lost any."""
    dropped = (keep < 0.5) & (m > 0)
    rows = m.sum(dim=-1) > 0
    seq = (dropped.any(dim=-1) & rows).sum() / rows.sum().clamp(min=1)
    return {
        f"{prefix}_token_frac": masked_mean(dropped.to(m.dtype), m).item(),
        f"{prefix}_seq_frac": float(seq),
    }


def _mode_weights(
    log_ratio: Tensor, m: Tensor, mode: str, threshold: float
) -> tuple[Tensor, dict[str, float]]:
    """The weight mode's weights (B, T), before any band, and correction_clipped_frac."""
    if mode == "icepop":  # the ratio itself: its band is applied with the masks
        return clamp_log_ratio(log_ratio).exp(), {}
    if threshold <= 1.0:
        raise ValueError(f"rollout correction threshold must be > 1, got {threshold}")
    if mode == "decoupled":  # AReaL's behaviour weight: kept up to the cap, 0 above it
        ratio = clamp_log_ratio(log_ratio).exp()
        over = ratio > threshold
        weights = torch.where(over, torch.zeros_like(ratio), ratio)
        return weights, {"correction_clipped_frac": float(masked_mean(over.to(m.dtype), m))}
    level, how = ("sequence", "truncate") if mode == "seq_masked_tis" else mode.split("_")
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
    return weights, {"correction_clipped_frac": float(frac)}


@torch.no_grad()
def logp_abs_diff(a: Tensor, b: Tensor, mask: Tensor) -> float:
    """Mean |a - b| over valid tokens: how far two log-prob computations of the same tokens
    disagree (the rollout_vs_old_logp_abs_diff metric)."""
    return masked_mean((a - b).abs(), mask.to(a.dtype)).item()
