"""train.logprobs_on: trainer: the old-policy and reference log-probs computed by the trainer
ranks before the step's first update, each rank scoring its own groups, then gathered."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from grpo.core.episode import EpisodeBatch
from grpo.plan import ScoringPlan
from grpo.scoring.score import score_for_training


def score_on_ranks(
    policy: torch.nn.Module | None,
    reference: torch.nn.Module | None,
    batch: EpisodeBatch,
    plan: ScoringPlan,
    groups_per_rank: int,
    pad_id: int,
) -> EpisodeBatch:
    """`batch` with old (the current weights, before this step's first update) and reference
    log-probs of every answer, each unless its model is None. The engine's log-probs are put
    on the full vocabulary here, as the sampler does when it scores
    (grpo.scoring.score.score_for_training)."""
    g0 = dist.get_rank() * groups_per_rank
    mine = batch.select_groups(g0, g0 + groups_per_rank).episodes
    scored = score_for_training(
        policy,
        reference,
        [e.prompt_ids for e in mine],
        [e.completion_ids for e in mine],
        [e.rollout_logp for e in mine],
        truncation=plan.truncation,
        pad_id=pad_id,
        temperature=plan.temperature,
        packed=plan.packed,
        batch_size=plan.batch_size,
    )
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, scored)  # among the trainer ranks, never on the wire
    arrays = {
        name: [a for rank in gathered for a in rank[i]]
        for i, name in enumerate(("old_logp", "ref_logp", "rollout_logp"))
    }
    # None: a pass the run skips (policy or reference not given), or an engine without
    # log-probs.
    return batch.with_arrays(**{k: v for k, v in arrays.items() if v and v[0] is not None})
