"""A batch to its experience as the trainer's step takes it (grpo.trainer.step.train_step calls
these stages in this order), for tests that need one without a trainer."""

from __future__ import annotations

import torch

from grpo.core.episode import EpisodeBatch
from grpo.plan import ExperiencePlan
from grpo.trainer.experience import (
    Experience,
    padded_experience,
    with_advantages,
    with_kl_in_reward,
    with_loss_mask,
)


def build_experience(
    batch: EpisodeBatch,
    plan: ExperiencePlan,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
) -> tuple[Experience, dict[str, float]]:
    """The experience with its advantages, and the stages' metrics; without the critic's
    `values`, an estimator of them (GAE) leaves the advantages out."""
    exp = padded_experience(batch, plan)
    exp, numbers = with_kl_in_reward(exp, plan, kl_coef)
    exp, more = with_loss_mask(exp, batch.columns.finish_reason, plan)
    if values is None and plan.advantage.estimator.needs_critic:
        return exp, numbers | more
    exp, most = with_advantages(exp, plan, batch.columns.reward_info, values)
    return exp, numbers | more | most
