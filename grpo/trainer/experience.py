"""The experience: a received batch becomes, once per step, one padded tensor batch that every
later stage reads. The step (grpo.trainer.step) calls its stages in order: the padded batch
with its shaped score, the KL in the reward, the loss mask and rollout correction, the
advantages. Nothing downstream pads per-token data again.

Every tensor is on the CPU, (N, C) with C the longest answer of the batch, aligned with `mask`;
a micro-batch takes its rows with :meth:`Experience.rows` and moves them to its device once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from grpo.algos import (
    broadcast_to_tokens,
    kl_penalty,
    masked_mean,
    masked_whiten,
    token_level_rewards,
)
from grpo.algos.correction import logp_abs_diff, rollout_correction_weights, rollout_rejection
from grpo.core.batching import length_mask, pad_answers
from grpo.core.episode import EpisodeBatch, reward_components
from grpo.plan import ExperiencePlan


@dataclass(frozen=True)
class Experience:
    prompts: tuple[np.ndarray, ...]  # int32 (P_i,) per episode: the forwards' inputs
    completions: tuple[np.ndarray, ...]  # int32 (C_i,)
    group_size: int
    mask: torch.Tensor  # (N, C) 1.0 on the answer tokens the model sampled, 0 on a tool's
    # results (multi-turn) and padding: advantages, KL, the critic and the loss read only these
    loss_mask: torch.Tensor  # (N, C) mask, 0 for answers that get no loss (mask_truncated)
    old_logp: torch.Tensor | None  # (N, C) under the sampling policy; None: the training
    # forward's own, detached (grpo.config.passes)
    ref_logp: torch.Tensor | None  # (N, C) under the reference; None: no KL term uses it
    token_rewards: torch.Tensor  # (N, C) the shaped score on the last token, minus KL in reward
    rollout_logp: torch.Tensor | None = None  # (N, C) the engine's, when it reports them
    teacher_logp: torch.Tensor | None = None  # (N, C) on-policy distillation's teacher's
    is_weights: torch.Tensor | None = None  # (N, C) rollout-correction importance weights
    advantages: torch.Tensor | None = None  # (N, C), once computed
    returns: torch.Tensor | None = None  # (N, C) value targets (PPO)
    old_values: torch.Tensor | None = None  # (N, C) the critic's before its update (PPO)
    # (N, C) int64, the weights version that sampled each token (continuous generation, 0 on
    # padding); None: every token of the batch's policy_version
    token_versions: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """(prompt, completion) length of each episode."""
        return [(len(p), len(c)) for p, c in zip(self.prompts, self.completions, strict=True)]

    def rows(self, index: Sequence[int] | slice) -> Experience:
        """The episodes at `index` (in that order), trimmed to their longest answer."""
        ids = list(range(len(self))[index]) if isinstance(index, slice) else list(index)
        width = max([1, *(len(self.completions[i]) for i in ids)])
        pick = torch.as_tensor(ids, dtype=torch.long)

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[pick, :width]

        tensors = {name: take(getattr(self, name)) for name in _ROW_TENSORS}
        return replace(
            self,
            prompts=tuple(self.prompts[i] for i in ids),
            completions=tuple(self.completions[i] for i in ids),
            **tensors,
        )

    @property
    def no_loss_rows(self) -> torch.Tensor:
        """(N, 1) True for answers that have sampled tokens but no loss (mask_truncated): their
        advantages are zeroed, whichever estimator made them."""
        return (self.loss_mask.sum(dim=-1, keepdim=True) == 0) & (
            self.mask.sum(dim=-1, keepdim=True) > 0
        )

    def loss_tokens(self) -> int:
        """Answer tokens that count in the loss (at least 1)."""
        return max(1, int(self.loss_mask.sum()))


# Every (N, C) tensor of an Experience: its fields but the episodes' ids and the group size.
_ROW_TENSORS = tuple(
    f.name for f in fields(Experience) if f.name not in ("prompts", "completions", "group_size")
)


def shaped_rewards(batch: EpisodeBatch, plan: ExperiencePlan) -> torch.Tensor:
    """Per-episode rewards (N,), through the plan's shaping in order (DAPO's overlong penalty
    when algo.overlong_buffer > 0)."""
    rewards = torch.as_tensor(batch.columns.reward, dtype=torch.float32)
    lengths = torch.as_tensor(batch.columns.completion_len)
    for shape in plan.shaping:
        rewards = shape(rewards, lengths)
    return rewards


def padded_experience(batch: EpisodeBatch, plan: ExperiencePlan) -> Experience:
    """The step's first stage: the batch as (N, C) tensors, its shaped score on each answer's
    last token. Every rank builds the whole batch's experience, so group baselines and batch
    whitening see every group; each then trains on its own rows."""
    eps, c = batch.episodes, batch.columns
    mask = length_mask(c.completion_len.tolist())  # (N, C)
    width = mask.shape[1]

    def padded(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
        """An optional per-token column as (N, C), straight from the batch's columns."""
        flat = getattr(c, name)
        return None if flat is None else pad_answers(flat, c.completion_len, width, dtype)

    if c.loss_mask is not None:  # a tool's tokens are not the policy's actions
        mask = mask * padded("loss_mask")
    return Experience(
        prompts=tuple(e.prompt_ids for e in eps),
        completions=tuple(e.completion_ids for e in eps),
        group_size=batch.group_size,
        mask=mask,
        loss_mask=mask,
        old_logp=padded("old_logp"),
        ref_logp=padded("ref_logp"),
        token_rewards=token_level_rewards(shaped_rewards(batch, plan), mask),
        rollout_logp=padded("rollout_logp"),
        teacher_logp=padded("teacher_logp"),
        token_versions=padded("token_versions", torch.int64),
    )


def with_kl_in_reward(
    exp: Experience, plan: ExperiencePlan, kl_coef: float
) -> tuple[Experience, dict[str, float]]:
    """The mean per-token KL(old || ref) of the sampling policy, when both were scored; with
    algo.kl_in_reward every token also pays kl_coef times it (PPO-RLHF style)."""
    old, ref, mask = exp.old_logp, exp.ref_logp, exp.mask
    if old is None or ref is None:
        return exp, {}
    kl = kl_penalty(old, ref, plan.kl_reward_kind) * mask  # (N, C)
    metrics = {"rollout_kl_to_ref": float(masked_mean(kl, mask))}
    if plan.kl_in_reward:
        exp = replace(exp, token_rewards=exp.token_rewards - kl_coef * kl)
    return exp, metrics


def with_loss_mask(
    exp: Experience, finish_reasons: Sequence[str], plan: ExperiencePlan
) -> tuple[Experience, dict[str, float]]:
    """Which tokens the loss counts, and how much: none of an answer cut at max_new_tokens
    (algo.mask_truncated, DAPO: it says nothing of its ending), the rollout correction's
    weights, none of the tokens it rejects; and the engine-vs-old log-prob comparison when the
    engine reported log-probs."""
    old, rollout, mask = exp.old_logp, exp.rollout_logp, exp.mask
    loss_mask = mask.clone()
    loss_mask[[plan.mask_truncated and r == "length" for r in finish_reasons]] = 0.0
    metrics: dict[str, float] = {}
    is_weights = None
    if rollout is not None and old is not None:
        # rollout_logp is already on the full vocabulary (grpo.scoring.score.score_for_training),
        # so the ratio compares like with like under top-p / top-k too.
        metrics["rollout_vs_old_logp_abs_diff"] = logp_abs_diff(old, rollout, mask)
        if (fix := plan.correction) is not None:
            is_weights, more = rollout_correction_weights(
                old, rollout, mask, fix.spec, fix.threshold, fix.bands
            )
            metrics |= more
            # Rejected tokens leave the loss altogether, as verl's rejection sampling.
            loss_mask = loss_mask * rollout_rejection(old, rollout, mask, fix.spec, fix.bands)
    return replace(exp, loss_mask=loss_mask, is_weights=is_weights), metrics


def with_advantages(
    exp: Experience,
    plan: ExperiencePlan,
    infos: Sequence[dict[str, Any]],
    values: torch.Tensor | None = None,
) -> tuple[Experience, dict[str, float]]:
    """(N, C) token advantages from the plan's estimator, every estimator here: a token
    estimator on the per-token rewards, or an outcome estimator on each answer's total, given
    to every token; each also gets the inputs it declared (grpo.algos.registry.
    ESTIMATOR_INPUTS): the plan's constants, the reward's parts (N, K) read from `infos`, the
    teacher's and the old policy's log-probs, the critic's `values` (N, C) of the whole batch.

    An estimator of the critic's values (GAE) is whitened over the batch's tokens (verl's
    masked_whiten, as its compute_gae_advantage_return), and its raw advantages plus the
    values are the critic's targets (`returns`)."""
    advantage = plan.advantage
    estimator = advantage.estimator
    teacher = exp.teacher_logp
    given: dict[str, Any] = {}
    if "components" in estimator.needs:
        given["components"] = torch.as_tensor(reward_components(infos)[1])
    if "teacher" in estimator.needs:
        given |= {"teacher_logp": teacher, "student_logp": exp.old_logp,
                  "group_size": exp.group_size}  # fmt: skip
    if estimator.needs_critic:
        assert values is not None, "an estimator of the critic's values needs them"
        given["values"] = values
    if estimator.token_level:
        token_adv = advantage(exp.token_rewards, exp.mask, **given)
    else:
        outcome = advantage(exp.token_rewards.sum(dim=-1), exp.group_size, **given)
        token_adv = broadcast_to_tokens(outcome, exp.mask)
    returns = None
    if values is not None:
        returns = (token_adv + values) * exp.mask
        token_adv = masked_whiten(token_adv, exp.mask)
    exp = replace(
        exp,
        advantages=token_adv.masked_fill(exp.no_loss_rows, 0.0),
        returns=returns,
        old_values=values,
    )
    metrics: dict[str, float] = {}
    if teacher is not None:
        metrics["opd_advantage_mean"] = float(masked_mean(exp.advantages, exp.loss_mask))
        if exp.old_logp is not None:
            # Minus OPD's advantage: the k1 estimate of KL(old || teacher) per token.
            metrics["opd_reverse_kl"] = float(masked_mean(exp.old_logp - teacher, exp.mask))
    return exp, metrics


@torch.no_grad()
def token_version_metrics(
    versions: torch.Tensor, mask: torch.Tensor, current: int
) -> dict[str, float]:
    """How old the tokens of a step's batch are, per token (continuous generation).

    `versions` (N, C): the weights version that sampled each token; `mask` (N, C): the tokens
    that count (the model's, not padding nor a tool's results); `current`: the version of the
    weights the step trains (step - 1, as `staleness`). token_version_lag_mean and
    token_version_lag_max: current - version over those tokens; answers_multi_version_share:
    the share of answers (with at least one such token) whose tokens span more than one
    version. Empty when no token counts."""
    valid = mask > 0
    if not bool(valid.any()):
        return {}
    lag = current - versions[valid]
    newest = versions.masked_fill(~valid, torch.iinfo(versions.dtype).min).amax(dim=-1)
    oldest = versions.masked_fill(~valid, torch.iinfo(versions.dtype).max).amin(dim=-1)
    answers = valid.any(dim=-1)
    multi = (newest > oldest) & answers
    return {
        "token_version_lag_mean": float(lag.double().mean()),
        "token_version_lag_max": float(lag.max()),
        "answers_multi_version_share": float(multi.sum()) / float(answers.sum()),
    }
