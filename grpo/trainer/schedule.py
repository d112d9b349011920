"""The learning-rate schedule: a linear warmup from 0, then constant, linear or cosine decay to
`train.lr_min_ratio` x `train.lr` at the run's last optimizer step (the usual choices of TRL's
and verl's configs). DeepSpeed steps it after each optimizer step it takes (a step it skips
for non-finite gradients does not count) and saves it with the training state, so a resumed
run goes on where the crashed one was."""

from __future__ import annotations

import math
from typing import Any

from grpo.config import Config


def lr_factor(step: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """The multiple of the base learning rate for optimizer step `step` (0-based) of `total`."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    done = min(1.0, (step - warmup) / max(1, total - warmup))
    shape = 1.0 - done if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
    return min_ratio + (1.0 - min_ratio) * shape


def steps_per_batch(cfg: Config, world: int) -> int:
    """Optimizer steps per received batch: ppo_epochs passes of a rank's mini-batches."""
    per_rank = cfg.rollout.questions_per_step * cfg.rollout.group_size // world
    return cfg.train.ppo_epochs * per_rank // cfg.mini_batch_seqs(world)


def optimizer_steps(cfg: Config, world: int) -> int:
    """The run's optimizer steps."""
    return cfg.train.total_steps * steps_per_batch(cfg, world)


def scheduler_for(cfg: Config, world: int) -> Any:
    """What deepspeed.initialize takes as `lr_scheduler`: a function of the optimizer."""
    import torch

    t, total = cfg.train, optimizer_steps(cfg, world)

    def factor(step: int) -> float:
        return lr_factor(step, t.lr_warmup_steps, total, t.lr_schedule, t.lr_min_ratio)

    return lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
