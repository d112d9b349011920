"""The update: `train.ppo_epochs` passes over this rank's rows of the experience, one optimizer
step per mini-batch, micro-batched; with PPO, GAE from the critic's values first and the
critic's own updates after.

The policy and the critic share the passes (:func:`mini_batches`) and the optimizer step
(:func:`optimizer_step`: the micro-batches' backwards, each weighted by its share, then the
step); each brings its own micro-batch loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist

from grpo.plan import Objective, UpdatePlan
from grpo.runtime.progress import ACTIVITY
from grpo.trainer.critic import Critic
from grpo.trainer.experience import Experience
from grpo.trainer.objective import micro_batch_loss
from grpo.trainer.ranks import accumulate_backward, micro_batches, sum_across_ranks

# A micro-batch's loss, its (B, C) mask of the tokens that loss counts, and its metrics (0-d
# tensors), all on the model's device: grpo.trainer.objective.micro_batch_loss for the policy,
# Critic.micro_batch_loss for the critic.
MicroBatchLoss = Callable[[Experience], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]


def mini_batches(mine: Experience, plan: UpdatePlan) -> Iterator[Experience]:
    """This rank's rows `mine` as the update takes them, one optimizer step each:
    `ppo_epochs` passes, each over consecutive mini-batches of `mini_batch_seqs` rows in the
    experience's order (:func:`optimizer_step` splits each into micro-batches)."""
    size = plan.mini_batch_seqs
    for _ in range(plan.ppo_epochs):
        for start in range(0, len(mine), size):
            yield mine.rows(slice(start, start + size))


def optimizer_step(
    engine,
    mini: Experience,
    plan: UpdatePlan,
    loss_of: MicroBatchLoss,
    counted: torch.Tensor,
    token_mean: bool,
) -> tuple[dict[str, torch.Tensor], int]:
    """Forward/backward every micro-batch of the mini-batch `mini` with `loss_of`, then one
    optimizer step of `engine`. `counted` is the mini-batch's (N, C) mask of the tokens the
    loss counts.

    Returns token-weighted mean metrics (0-d tensors on the device) and this rank's count of
    the tokens the loss counts."""
    n_tokens = max(1, int(counted.sum()))
    # token-mean is over the tokens of all ranks: each rank's gradient gets its token share
    # (DeepSpeed then averages the ranks, hence the factor `world` below).
    world = dist.get_world_size()
    all_tokens = float(sum_across_ranks(torch.tensor([float(n_tokens)])))
    parts = micro_batches(mini.sizes, engine.train_micro_batch_size_per_gpu(),
                          plan.micro_batch_tokens, plan.objective.packed)  # fmt: skip
    sums: dict[str, torch.Tensor] = {}
    for i, index in enumerate(parts):
        loss, mask, metrics = loss_of(mini.rows(index))
        # Weight each micro-batch by its share of the mini-batch's tokens (or of the rank's
        # sequences): the sum is the aggregate over the mini-batch, not a mean of micro-batch
        # means.
        tokens = mask.sum()
        share = tokens / max(all_tokens, 1.0) * world if token_mean else len(index) / len(mini)
        accumulate_backward(engine, loss * share, last=i == len(parts) - 1)
        ACTIVITY.tick()  # progress for the stall check (grpo.runtime.progress)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + tokens / n_tokens * value
    return sums, n_tokens


def train_on_batch(engine, mine: Experience, plan: UpdatePlan, pad_id: int) -> dict[str, float]:
    """`train.ppo_epochs` passes over this rank's rows `mine`, one optimizer step per
    mini-batch. The ratio's old log-probs are those recorded before the first update (by the
    sampler or the trainer), in every pass. Metrics stay on the device until the end: one
    transfer per batch, not one per micro-batch."""
    token_mean = plan.objective.policy.agg == "token-mean"
    policy_loss = partial(finite_policy_loss, engine, objective=plan.objective, pad_id=pad_id)
    sums: dict[str, torch.Tensor] = {}
    total = 0.0
    for mini in mini_batches(mine, plan):
        metrics, tokens = optimizer_step(engine, mini, plan, policy_loss, mini.loss_mask,
                                         token_mean)  # fmt: skip
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + tokens * value
        total += tokens
    out = {key: float(value) / max(total, 1.0) for key, value in sums.items()}
    grad_norm = engine.get_global_grad_norm()  # of the last step; None or inf when skipped
    if grad_norm is not None and math.isfinite(float(grad_norm)):
        out["grad_norm"] = float(grad_norm)
    out["lr"] = float(engine.get_lr()[0])  # for the next step (train.lr_schedule)
    return out


def finite_policy_loss(
    engine, part: Experience, objective: Objective, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The policy's micro_batch_loss, refusing a non-finite loss."""
    loss, mask, metrics = micro_batch_loss(engine, part, objective, pad_id)
    # The one sync per micro-batch, and a needed one: a non-finite loss stops the run before
    # the optimizer applies it.
    if not torch.isfinite(loss):
        raise FloatingPointError(
            f"non-finite loss ({float(loss)}): lower train.lr or check the rewards; "
            "this optimizer step was not applied and nothing more was published"
        )
    return loss, mask, metrics


def whiten_across_ranks(raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, C) advantages of this rank's episodes, whitened with the mean and variance of all
    ranks' tokens (masked_whiten's convention: unbiased variance, eps inside the square root):
    each rank holds only its own critic values, so the statistics are summed across ranks."""
    n, total, square = sum_across_ranks(
        torch.stack([mask.sum(), raw.sum(), (raw.square() * mask).sum()]).double()
    ).tolist()
    mean = total / max(n, 1.0)
    var = max(square / max(n, 1.0) - mean**2, 0.0) * n / max(n - 1.0, 1.0)
    return (raw - mean) / (var + 1e-8) ** 0.5 * mask


def ppo_update(
    engine,
    critic: Critic,
    mine: Experience,
    plan: UpdatePlan,
    pad_id: int,
    train_policy: bool,
) -> dict[str, float]:
    """PPO with a critic: values before the update, the estimator of them (GAE) whitened over
    all ranks, then the policy's update (unless the critic is still warming up) and the
    critic's, as many passes and mini-batches as the policy's."""
    old_values = critic.values(mine, pad_id)
    raw = plan.advantage(mine.token_rewards, mine.mask, values=old_values)  # (B, C)
    returns = (raw + old_values) * mine.mask  # the critic's targets
    adv = whiten_across_ranks(raw, mine.mask).masked_fill(mine.no_loss_rows, 0.0)
    mine = replace(mine, advantages=adv, returns=returns, old_values=old_values)
    metrics = train_on_batch(engine, mine, plan, pad_id) if train_policy else {}
    value_loss = partial(critic.micro_batch_loss, pad_id=pad_id)
    sums: dict[str, float] = {}
    steps = 0
    for mini in mini_batches(mine, plan):
        # the value loss is a token mean over all ranks' tokens, as the policy's by default
        step_metrics, _ = optimizer_step(
            critic.engine, mini, plan, value_loss, mini.mask, token_mean=True
        )
        for key, value in step_metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)  # one transfer per step and metric
        steps += 1
    return metrics | {key: value / steps for key, value in sums.items()}
