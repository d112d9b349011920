"""Does a well-formed batch fit this trainer? Decoding proved the frames are a batch; this
checks that it is one the trainer can train on. A batch that does not fit is dropped and
its sampler told why, rather than stopping every rank in the middle of a step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo.config.passes import SCORED_ARRAYS
from grpo.core.episode import EpisodeBatch


@dataclass(frozen=True)
class Expected:
    groups: int  # rollout.questions_per_step: DeepSpeed's accumulation steps depend on it
    group_size: int
    arrays: frozenset[str]  # the log-probs the sampler computes: passes.scored_by(cfg, "sampler")
    vocab_size: int  # token ids at or above it would index past the embedding table


def misfit(batch: EpisodeBatch, want: Expected) -> str | None:
    """Why the trainer cannot train on ``batch`` (a message naming the config key to align),
    or None when it fits."""
    got = (batch.num_groups, batch.group_size)
    if got != (want.groups, want.group_size):
        return (
            f"it has {got[0]} groups of {got[1]}, but the trainer expects {want.groups} groups "
            f"of {want.group_size}: start the sampler and the trainer with the same "
            "rollout.questions_per_step and rollout.group_size"
        )
    for name in SCORED_ARRAYS:
        has = getattr(batch.columns, name) is not None
        if has != (name in want.arrays):
            return (
                f"it {'has' if has else 'lacks'} {name}, but this trainer expects "
                f"{'it' if name in want.arrays else 'none'} (train.logprobs_on and the passes "
                "the algo section needs): start both roles with the same config"
            )
    c = batch.columns
    top = max((int(ids.max()) for ids in (c.prompt_ids, c.completion_ids) if ids.size), default=0)
    if top >= want.vocab_size:
        return (
            f"it holds token id {top}, beyond the model's {want.vocab_size} embeddings: start "
            "the sampler and the trainer with the same model.path"
        )
    for name in ("old_logp", "ref_logp", "rollout_logp"):
        values = getattr(c, name)
        if values is not None and not np.isfinite(values).all():
            return f"its {name} holds a value that is not finite"
    return None
