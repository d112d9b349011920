"""A policy loss written outside grpo/, as a user would: plain REINFORCE (no ratio, no clip).
Selected with `algo.loss=tests.plugins.toy_loss:reinforce`; nothing in grpo/ names it.

Besides the usual metrics it reports one no built-in loss has, `reinforce_logp`: a run's
metrics.jsonl holding it shows that this loss ran (tests/test_plugins.py)."""

import torch
from torch import Tensor

from grpo.algos import agg_loss, masked_mean


def reinforce(
    old_logp: Tensor, logp: Tensor, advantages: Tensor, mask: Tensor, *, agg: str = "token-mean"
) -> tuple[Tensor, dict[str, Tensor]]:
    """-A * log pi(y) per token, aggregated with `agg`; metrics as 0-d tensors, with the mean
    log-prob of the answers' tokens (what the loss weights) as `reinforce_logp`."""
    loss = agg_loss(-advantages * logp, mask, agg)
    with torch.no_grad():
        metrics = {"clip_frac": torch.zeros((), device=logp.device),
                   "approx_kl": masked_mean(old_logp - logp, mask),
                   "reinforce_logp": masked_mean(logp, mask)}  # fmt: skip
    return loss, metrics
