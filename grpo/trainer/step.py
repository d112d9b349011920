"""One training step, top to bottom: score the batch, build its experience, update the policy
(and critic), adapt the KL coefficient. What surrounds a step (receiving the batch, publishing,
saving, the metrics row) is the loop's: grpo.trainer.loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo.core.episode import EpisodeBatch
from grpo.plan import RunPlan
from grpo.runtime.progress import SCORING, TRAINING, Stopwatch
from grpo.trainer.critic import Critic
from grpo.trainer.experience import build_experience, token_version_metrics
from grpo.trainer.ranks import average_across_ranks
from grpo.trainer.scoring import score_on_ranks
from grpo.trainer.update import ppo_update, train_on_batch


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
            batch = score_on_ranks(policy, models.reference, batch, plan.scoring, shard.groups,
                                   pad_id)  # fmt: skip
    with seconds.stage("train_s", TRAINING, f"step {step}"):
        exp, numbers = build_experience(batch, plan.experience, kl_reward_coef)
        if exp.token_versions is not None:  # the weights this step trains are version step - 1
            numbers |= token_version_metrics(exp.token_versions, exp.mask, step - 1)
        mine = exp.rows(shard.rows(batch.group_size))
        skipped_before = models.skipped_steps()
        if models.critic is None:
            local = train_on_batch(models.policy, mine, plan.update, pad_id)
        else:  # the policy waits while the critic warms up
            train_policy = step > plan.update.critic_warmup_steps
            local = ppo_update(models.policy, models.critic, mine, plan.update, pad_id,
                               train_policy)  # fmt: skip
        skipped = {k: n - skipped_before[k] for k, n in models.skipped_steps().items()}
        kl = numbers.get("rollout_kl_to_ref")  # the sampling policy's, when both were scored
        next_coef = plan.kl_control.next(kl_reward_coef, kl, len(exp))
        numbers |= {"kl_reward_coef": kl_reward_coef} | average_across_ranks(local)
    return StepResult(batch, numbers, next_coef, skipped)
