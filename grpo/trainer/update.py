"""The update: `train.ppo_epochs` passes over this rank's rows of the experience, one optimizer
step per mini-batch, micro-batched; with PPO, GAE from the critic's values first and the
critic's own updates after.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.distributed as dist

from grpo.algos import gae
from grpo.config import Config
from grpo.runtime.progress import ACTIVITY
from grpo.trainer.critic import Critic
from grpo.trainer.experience import Experience
from grpo.trainer.objective import FALLBACK_AGG, micro_batch_loss, resolved_loss_options
from grpo.trainer.ranks import accumulate_backward, micro_batches, sum_across_ranks


def train_on_batch(engine, mine: Experience, cfg: Config, pad_id: int) -> dict[str, float]:
    """`train.ppo_epochs` passes over this rank's rows `mine`, one optimizer step per
    mini-batch. The ratio's old log-probs are those recorded before the first update (by the
    sampler or the trainer), in every pass. Metrics stay on the device until the end: one
    transfer per batch, not one per micro-batch."""
    size = cfg.mini_batch_seqs(dist.get_world_size())
    sums: dict[str, torch.Tensor] = {}
    total = 0.0
    for _ in range(cfg.train.ppo_epochs):
        for start in range(0, len(mine), size):
            metrics, tokens = optimizer_step(engine, mine.rows(slice(start, start + size)), cfg,
                                             pad_id)  # fmt: skip
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + tokens * value
            total += tokens
    out = {key: float(value) / max(total, 1.0) for key, value in sums.items()}
    grad_norm = engine.get_global_grad_norm()  # of the last step; None or inf when skipped
    if grad_norm is not None and math.isfinite(float(grad_norm)):
        out["grad_norm"] = float(grad_norm)
    return out


def optimizer_step(
    engine, mini: Experience, cfg: Config, pad_id: int
) -> tuple[dict[str, torch.Tensor], float]:
    """Forward/backward every micro-batch of one mini-batch, then one optimizer step.

    Returns token-weighted mean metrics (0-d tensors on the device) and this rank's token
    count."""
    agg = resolved_loss_options(cfg)[0] or FALLBACK_AGG
    n_tokens = mini.loss_tokens()
    # token-mean is over the tokens of all ranks: each rank's gradient gets its token share
    # (DeepSpeed then averages the ranks, hence the factor `world` below).
    world = dist.get_world_size()
    all_tokens = float(sum_across_ranks(torch.tensor([float(n_tokens)])))
    parts = micro_batches(mini.sizes, cfg, engine.train_micro_batch_size_per_gpu())
    sums: dict[str, torch.Tensor] = {}
    for i, index in enumerate(parts):
        loss, mask, metrics = micro_batch_loss(engine, mini.rows(index), cfg, pad_id)
        # The one sync per micro-batch, and a needed one: a non-finite loss stops the run
        # before the optimizer applies it.
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite loss ({float(loss)}): lower train.lr or check the rewards; "
                "this optimizer step was not applied and nothing more was published"
            )
        # Weight each micro-batch by its share of the mini-batch's tokens (or of the rank's
        # sequences): the sum is the aggregate over the mini-batch, not a mean of micro-batch
        # means.
        tokens = mask.sum()
        if agg == "token-mean":
            share = tokens / max(all_tokens, 1.0) * world
        else:
            share = len(index) / len(mini)
        accumulate_backward(engine, loss * share, last=i == len(parts) - 1)
        ACTIVITY.tick()  # progress for the stall check (grpo.runtime.progress)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + tokens / n_tokens * value
    return sums, float(n_tokens)


def gae_across_ranks(
    rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on this rank's episodes, whitened with the mean and variance of all ranks' tokens
    (masked_whiten's convention: unbiased variance, eps inside the square root).

    (B, C) each -> (advantages, returns). Each rank holds only its own values, so the batch
    statistics of the whitening are summed across ranks."""
    _, returns = gae(rewards, values, mask, gamma, lam)
    raw = (returns - values) * mask  # (B, C) unwhitened advantages
    n, total, square = sum_across_ranks(
        torch.stack([mask.sum(), raw.sum(), (raw.square() * mask).sum()]).double()
    ).tolist()
    mean = total / max(n, 1.0)
    var = max(square / max(n, 1.0) - mean**2, 0.0) * n / max(n - 1.0, 1.0)
    return (raw - mean) / (var + 1e-8) ** 0.5 * mask, returns


def ppo_update(
    engine, critic: Critic, mine: Experience, cfg: Config, pad_id: int, train_policy: bool
) -> dict[str, float]:
    """PPO with a critic: values before the update, GAE, then the policy's update (unless the
    critic is still warming up) and the critic's, as many passes and mini-batches as the
    policy's."""
    old_values = critic.values(mine, pad_id)
    adv, returns = gae_across_ranks(mine.token_rewards, mine.mask, old_values, cfg.algo.gamma,
                                    cfg.algo.lam)  # fmt: skip
    mine = replace(mine, advantages=adv.masked_fill(mine.no_loss_rows, 0.0), returns=returns,
                   old_values=old_values)  # fmt: skip
    metrics = train_on_batch(engine, mine, cfg, pad_id) if train_policy else {}
    size, passes, sums = cfg.mini_batch_seqs(dist.get_world_size()), 0, {}
    for _ in range(cfg.train.ppo_epochs):
        for start in range(0, len(mine), size):
            for key, value in critic.update(mine.rows(slice(start, start + size)),
                                            pad_id).items():  # fmt: skip
                sums[key] = sums.get(key, 0.0) + value
            passes += 1
    return metrics | {key: value / passes for key, value in sums.items()}
