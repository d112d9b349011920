"""Scoring completions for training: old-policy, reference and rollout log-probs of whole
batches of (prompt, completion) pairs, a fixed number of pairs per forward."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from grpo.runtime.progress import ACTIVITY
from grpo.scoring.forward import pairs_logprobs
from grpo.scoring.kernels import Truncation


def score_for_training(
    policy,
    reference,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    rollout: Sequence[np.ndarray | None],
    *,
    truncation: Truncation,
    **score_args,
) -> tuple[list, list, list[np.ndarray | None]]:
    """Old-policy and reference log-probs of each completion, and the rollout engine's
    log-probs (None where there are none) put on the full vocabulary.

    A model given as None is not run and its log-probs are all None (grpo.config.passes says
    which passes a run needs). The engine reports log-probs over the tokens top-p / top-k kept;
    adding the log of the kept mass, measured with the policy's logits, makes them comparable
    with the old ones, the only log-probs they are compared with. Shared by the sampler and the
    trainer (train.logprobs_on); `score_args` go to :func:`score_pairs`."""
    absent: list = [None] * len(completions)
    old, ref, rollout = absent, absent, list(rollout)
    if policy is not None:
        has_rollout = all(r is not None for r in rollout)
        kept_by = truncation if has_rollout else None
        old, kept = score_pairs(policy, prompts, completions, truncation=kept_by, **score_args)
        if kept is not None:
            rollout = [r + m for r, m in zip(rollout, kept, strict=True)]
    if reference is not None:
        ref, _ = score_pairs(reference, prompts, completions, **score_args)
    return old, ref, rollout


@torch.no_grad()
def score_pairs(
    model,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    *,
    pad_id: int,
    temperature: float,
    packed: bool,
    truncation: Truncation | None = None,
    batch_size: int = 16,
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Per-token log-probs of each completion under `model`, `batch_size` pairs per forward:
    one float32 array per completion, and with an active `truncation` the log kept mass at
    each token too (else None). `packed` as in :func:`pairs_logprobs`."""
    logps: list[np.ndarray] = []
    masses: list[np.ndarray] | None = [] if truncation is not None and truncation.active else None
    for start in range(0, len(prompts), batch_size):
        chunk = completions[start : start + batch_size]
        out = pairs_logprobs(
            model,
            prompts[start : start + batch_size],
            chunk,
            packed=packed,
            pad_id=pad_id,
            temperature=temperature,
            truncation=truncation,
        )
        ACTIVITY.tick()  # a forward done: progress for the stall check (grpo.runtime.progress)
        for i, c in enumerate(chunk):
            logps.append(out.logp[i, : len(c)].float().cpu().numpy())
            if masses is not None and out.log_kept_mass is not None:
                masses.append(out.log_kept_mass[i, : len(c)].float().cpu().numpy())
    return logps, masses
