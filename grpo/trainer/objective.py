"""The objective of one micro-batch: its forward, the policy loss, the KL and entropy terms.

Reads its rows of the step's Experience; everything it returns is on the model's device.
"""

from __future__ import annotations

import torch

from grpo.algos import agg_loss, kl_penalty, masked_mean
from grpo.plan import Objective
from grpo.scoring.forward import pairs_logprobs
from grpo.trainer.experience import Experience


def widen(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, C) -> (B, width) with zeros on the right."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def micro_batch_loss(
    model, part: Experience, objective: Objective, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of the micro-batch `part`, its (B, C) loss mask and its metrics (0-d tensors), on
    the model's device; `part`'s tensors come from the CPU and are moved here, once.
    `objective`: the run plan's (grpo.plan), its options settled before the run."""
    agg = objective.policy.agg
    logp, entropy, mask, _ = pairs_logprobs(
        model,
        part.prompts,
        part.completions,
        packed=objective.packed,
        pad_id=pad_id,
        temperature=objective.temperature,
        with_entropy=True,
        entropy_grad=objective.entropy_coef > 0,
    )
    device = logp.device
    assert part.advantages is not None, "advantages are computed before the update"
    mask, adv = part.loss_mask.to(device), part.advantages.to(device)
    # No old-policy pass (grpo.config.passes): these weights sampled the batch and have not
    # been updated on it yet, so this forward's log-probs are the old ones.
    old = logp.detach() if part.old_logp is None else part.old_logp.to(device)
    ref, is_w = (None if t is None else t.to(device) for t in (part.ref_logp, part.is_weights))
    if agg == "seq-mean-token-sum-norm":
        # Dr. GRPO divides by a constant, the longest possible answer, not by this
        # micro-batch's longest: widen the loss inputs (not the forward) to it.
        width = max(mask.shape[1], objective.max_new_tokens)
        old, adv, mask, logp, entropy = (widen(t, width) for t in (old, adv, mask, logp, entropy))
        ref, is_w = (None if t is None else widen(t, width) for t in (ref, is_w))
    pg_loss, pg_metrics = objective.policy(old, logp, adv, mask, is_weights=is_w)  # correction
    loss = pg_loss
    kl = None if ref is None else kl_penalty(logp, ref, objective.kl_kind)
    if kl is not None and objective.kl_coef:
        loss = loss + objective.kl_coef * agg_loss(kl, mask, agg)
    if objective.entropy_coef:
        loss = loss - objective.entropy_coef * agg_loss(entropy, mask, agg)
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
