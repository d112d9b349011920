"""One training step, top to bottom: score the batch, build its experience stage by stage,
advantages for every estimator at one place, then `train.ppo_epochs` passes over this rank's
rows, one optimizer step per mini-batch, micro-batched, down to the loss; with PPO the critic's
own passes after; then the KL coefficient adapts. What surrounds a step (receiving the batch,
publishing, saving, the metrics row) is the loop's: grpo.trainer.loop."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from grpo.algos import agg_loss, kl_penalty, masked_mean
from grpo.core.episode import EpisodeBatch
from grpo.plan import Objective, RunPlan, UpdatePlan
from grpo.runtime.progress import ACTIVITY, SCORING, TRAINING, Stopwatch
from grpo.scoring.forward import pairs_logprobs
from grpo.trainer.critic import Critic
from grpo.trainer.experience import (
    Experience,
    padded_experience,
    token_version_metrics,
    with_advantages,
    with_kl_in_reward,
    with_loss_mask,
)
from grpo.trainer.ranks import (
    accumulate_backward,
    average_across_ranks,
    gather_rows,
    micro_batches,
    sum_across_ranks,
)
from grpo.trainer.scoring import score_on_ranks

# A micro-batch's loss, its (B, C) mask of the tokens that loss counts, and its metrics (0-d
# tensors), all on the model's device: micro_batch_loss for the policy, Critic.micro_batch_loss
# for the critic.
LossOf = Callable[[Experience], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Models:
    """What a step trains and scores with."""

    policy: Any  # the DeepSpeed engine of the policy
    reference: torch.nn.Module | None  # when the trainer computes ref_logp itself
    critic: Critic | None  # PPO's value model (algo.advantage: gae)
    scored_here: frozenset[str]  # the log-probs the trainer computes (grpo.config.passes)

    def engines(self) -> dict[str, Any]:
        """The DeepSpeed engines, by the name their state is saved under."""
        return {"policy": self.policy} | ({"critic": self.critic.engine} if self.critic else {})

    def skipped_steps(self) -> dict[str, int]:
        """Optimizer steps each engine has skipped so far (DeepSpeed skips a step whose
        gradients are not finite, as bf16 overflows make them, and only counts it)."""
        return {name: engine.skipped_steps for name, engine in self.engines().items()}


@dataclass(frozen=True)
class RankGroups:
    """This rank's part of every batch: whole groups, the same on every step."""

    rank: int
    groups: int  # groups per rank

    @property
    def group_span(self) -> tuple[int, int]:
        """This rank's groups of the batch: [first, end)."""
        first = self.rank * self.groups
        return first, first + self.groups

    def rows(self, group_size: int) -> range:
        """This rank's rows: its groups' answers."""
        first, end = self.group_span
        return range(first * group_size, end * group_size)


@dataclass(frozen=True)
class StepResult:
    batch: EpisodeBatch  # as scored
    numbers: dict[str, float]  # the batch's own, the KL coefficient used, the update's
    kl_reward_coef: float  # for the next step
    skipped: dict[str, int]  # optimizer steps DeepSpeed skipped, per engine


def train_step(
    models: Models,
    batch: EpisodeBatch,
    plan: RunPlan,
    step: int,
    kl_reward_coef: float,
    shard: RankGroups,
    pad_id: int,
    seconds: Stopwatch,
) -> StepResult:
    """Every rank, on the same batch: score, build the experience, update on this rank's
    groups, adapt the KL coefficient (the same on every rank: they see the same batch)."""
    with seconds.stage("score_s", SCORING, f"step {step}"):
        if models.scored_here:
            policy = models.policy.module if "old_logp" in models.scored_here else None
            groups = shard.groups
            batch = score_on_ranks(policy, models.reference, batch, plan.scoring, groups, pad_id)
    with seconds.stage("train_s", TRAINING, f"step {step}"):
        # Every rank builds the whole batch's experience: group baselines and batch whitening
        # see every group; each rank then trains on its own rows.
        rows = shard.rows(batch.group_size)
        exp = padded_experience(batch, plan.experience)
        exp, numbers = with_kl_in_reward(exp, plan.experience, kl_reward_coef)
        exp, correction = with_loss_mask(exp, batch.columns.finish_reason, plan.experience)
        values = None
        if models.critic is not None:  # each rank scores its rows, every rank gets them all
            values_here = models.critic.values(exp.rows(rows), exp.mask.shape[1], pad_id)
            values = gather_rows(values_here)
        exp, advantage = with_advantages(exp, plan.experience, batch.columns.reward_info, values)
        numbers |= correction | advantage
        if exp.token_versions is not None:  # the weights this step trains are version step - 1
            numbers |= token_version_metrics(exp.token_versions, exp.mask, step - 1)
        skipped_before = models.skipped_steps()
        # the policy waits while the critic warms up
        train_policy = models.critic is None or step > plan.update.critic_warmup_steps
        mine = exp.rows(rows)
        local = update(models.policy, models.critic, mine, plan.update, pad_id, train_policy)
        skipped = {k: n - skipped_before[k] for k, n in models.skipped_steps().items()}
        kl = numbers.get("rollout_kl_to_ref")  # the sampling policy's, when both were scored
        next_coef = plan.kl_control.next(kl_reward_coef, kl, len(exp))
        numbers |= {"kl_reward_coef": kl_reward_coef} | average_across_ranks(local)
    return StepResult(batch, numbers, next_coef, skipped)


def update(
    engine,
    critic: Critic | None,
    mine: Experience,
    plan: UpdatePlan,
    pad_id: int,
    train_policy: bool = True,
) -> dict[str, float]:
    """`train.ppo_epochs` passes over this rank's rows `mine`, one optimizer step of the policy
    per mini-batch (unless `train_policy` is off: the critic warms up), then as many of the
    critic's. The ratio's old log-probs are those recorded before the first update (by the
    sampler or the trainer), in every pass. Metrics stay on the device until the end: one
    transfer per batch, not one per micro-batch."""
    out: dict[str, float] = {}
    if train_policy:
        token_mean = plan.objective.policy.agg == "token-mean"
        sums: dict[str, torch.Tensor] = {}
        total = 0.0
        for mini in mini_batches(mine, plan):
            metrics, tokens = optimizer_step(
                engine,
                mini,
                plan,
                lambda part: micro_batch_loss(engine, part, plan.objective, pad_id),
                mini.loss_mask,
                token_mean,
            )
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + tokens * value
            total += tokens
        out = {key: float(value) / max(total, 1.0) for key, value in sums.items()}
        grad_norm = engine.get_global_grad_norm()  # of the last step; None or inf when skipped
        if grad_norm is not None and math.isfinite(float(grad_norm)):
            out["grad_norm"] = float(grad_norm)
        out["lr"] = float(engine.get_lr()[0])  # for the next step (train.lr_schedule)
    if critic is None:
        return out
    value_sums: dict[str, float] = {}
    steps = 0
    for mini in mini_batches(mine, plan):
        # the value loss is a token mean over all ranks' tokens, as the policy's by default
        step_metrics, _ = optimizer_step(
            critic.engine,
            mini,
            plan,
            lambda part: critic.micro_batch_loss(part, pad_id),
            mini.mask,
            token_mean=True,
        )
        for key, value in step_metrics.items():
            value_sums[key] = value_sums.get(key, 0.0) + float(value)  # one transfer a metric
        steps += 1
    return out | {key: value / steps for key, value in value_sums.items()}


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
    loss_of: LossOf,
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
    micro = engine.train_micro_batch_size_per_gpu()
    parts = micro_batches(mini.sizes, micro, plan.micro_batch_tokens, plan.objective.packed)
    sums: dict[str, torch.Tensor] = {}
    for i, index in enumerate(parts):
        loss, mask, metrics = loss_of(mini.rows(index))
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
        share = tokens / max(all_tokens, 1.0) * world if token_mean else len(index) / len(mini)
        accumulate_backward(engine, loss * share, last=i == len(parts) - 1)
        ACTIVITY.tick()  # progress for the stall check (grpo.runtime.progress)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + tokens / n_tokens * value
    return sums, n_tokens


def widen(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, C) -> (B, width) with zeros on the right."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def micro_batch_loss(
    model, part: Experience, objective: Objective, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of the micro-batch `part` (its forward, the policy loss, the KL and entropy terms),
    its (B, C) loss mask and its metrics (0-d tensors), on the model's device, with no host
    sync; `part`'s tensors come from the CPU and are moved here, once."""
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
