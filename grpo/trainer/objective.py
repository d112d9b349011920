"""The objective of one micro-batch: its forward, the policy loss, the KL and entropy terms.

Reads its rows of the step's Experience; everything it returns is on the model's device.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from grpo.algos import agg_loss, get_policy_loss, kl_penalty, masked_mean, policy_loss
from grpo.config import Config
from grpo.scoring.forward import pairs_logprobs
from grpo.trainer.experience import Experience


def loss_default(loss_name: str, option: str) -> Any:
    """A policy loss's own default for `option` (what `null` in the config means): its
    signature is the one place it is written. None when it takes no such option."""
    parameter = inspect.signature(get_policy_loss(loss_name)).parameters.get(option)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default


def resolved_loss_options(cfg: Config) -> tuple[str, float, float]:
    """(agg, clip_low, clip_high), the config's or else the loss's own."""
    algo = cfg.algo
    agg, clip_low, clip_high = (
        loss_default(algo.loss, key) if value is None else value
        for key, value in (("agg", algo.agg), ("clip_low", algo.clip_low),
                           ("clip_high", algo.clip_high))
    )  # fmt: skip
    return agg, clip_low, clip_high


# How the KL and entropy terms, and the micro-batches' shares, are averaged when neither the
# config nor the loss names an aggregation.
FALLBACK_AGG = "token-mean"


def widen(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, C) -> (B, width) with zeros on the right."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def micro_batch_loss(
    model, part: Experience, cfg: Config, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of the micro-batch `part`, its (B, C) loss mask and its metrics (0-d tensors), on
    the model's device; `part`'s tensors come from the CPU and are moved here, once."""
    algo = cfg.algo
    loss_agg, clip_low, clip_high = resolved_loss_options(cfg)
    agg = loss_agg or FALLBACK_AGG
    logp, entropy, mask, _ = pairs_logprobs(
        model,
        part.prompts,
        part.completions,
        packed=cfg.packed,
        pad_id=pad_id,
        temperature=cfg.rollout.temperature,
        with_entropy=True,
        entropy_grad=algo.entropy_coef > 0,
    )
    device = logp.device
    assert part.advantages is not None, "advantages are computed before the update"
    mask, adv = part.loss_mask.to(device), part.advantages.to(device)
    # No old-policy pass (grpo.config.passes): these weights sampled the batch and have not
    # been updated on it yet, so this forward's log-probs are the old ones.
    old = logp.detach() if part.old_logp is None else part.old_logp.to(device)
    ref, is_w = (None if t is None else t.to(device) for t in (part.ref_logp, part.weights))
    if agg == "seq-mean-token-sum-norm":
        # Dr. GRPO divides by a constant, the longest possible answer, not by this
        # micro-batch's longest: widen the loss inputs (not the forward) to it.
        width = max(mask.shape[1], cfg.rollout.max_new_tokens)
        old, adv, mask, logp, entropy = (widen(t, width) for t in (old, adv, mask, logp, entropy))
        ref, is_w = (None if t is None else widen(t, width) for t in (ref, is_w))
    pg_loss, pg_metrics = policy_loss(
        algo.loss,
        old,
        logp,
        adv,
        mask,
        agg=loss_agg,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=algo.clip_c,
        weights=is_w,  # rollout correction
    )
    loss = pg_loss
    kl = None if ref is None else kl_penalty(logp, ref, algo.kl_kind)
    if kl is not None and algo.kl_loss_coef:
        loss = loss + algo.kl_loss_coef * agg_loss(kl, mask, agg)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * agg_loss(entropy, mask, agg)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "entropy": masked_mean(entropy, mask),
            **pg_metrics,  # the loss's own (clip_frac, approx_kl, ... for the built-in ones)
        }
        if kl is not None:
            metrics["kl"] = masked_mean(kl, mask)
    return loss, mask, metrics
