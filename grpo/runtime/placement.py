"""Which GPUs each role gets on this node: one pure rule, used by launch.sh.

launch.sh starts each role with CUDA_VISIBLE_DEVICES set to its GPUs, so inside a role the
first GPU is always `cuda:0` and the code needs no device indices of its own. On a node with
no GPU both roles get none and run on CPU with the same command lines.

launch.sh reads them through `python -m grpo launch-env CONFIG` (grpo.cli.launch_env).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from grpo.config import Config, ConfigError
from grpo.config.engines import abilities

# What the sampler's HF models may allocate of a GPU they share with the trainer: the
# embedded model's policy and reference plus a KV cache for 128 answers fit in far less.
SHARED_SAMPLER_FRACTION = 0.35


@dataclass(frozen=True)
class Placement:
    trainer: tuple[int, ...]  # GPU indices among the visible ones
    sampler: tuple[int, ...]

    @property
    def shared(self) -> bool:
        """Whether the two roles have a GPU in common (they then split its memory)."""
        return bool(set(self.trainer) & set(self.sampler))


def place(
    visible: int,
    role: str,
    num_ranks: int,
    sampler_gpus_needed: int,
    trainer_gpus: list[int],
    sampler_gpus: list[int],
) -> Placement:
    """The GPUs of each role on a node with `visible` GPUs. `role` is what launch.sh starts
    here (both, trainer or sampler); `sampler_gpus_needed` is vLLM's tensor-parallel size (1 for
    HF). Automatic: the trainer takes the first `num_ranks` GPUs and the sampler the rest; with
    too few left for the sampler it shares the trainer's first GPUs. Raises ConfigError."""
    if visible == 0:
        return Placement((), ())
    for key, gpus in (("train.gpus", trainer_gpus), ("rollout.gpus", sampler_gpus)):
        if any(g >= visible for g in gpus):
            raise ConfigError(f"{key}={gpus}: only {visible} GPU(s) are visible (0..{visible - 1})")
    trainer: tuple[int, ...] = ()
    if role in ("both", "trainer"):
        trainer = tuple(trainer_gpus) or tuple(range(num_ranks))
        if len(trainer) > visible:
            raise ConfigError(
                f"train.num_ranks={num_ranks} needs one GPU per rank, {visible} visible: "
                "lower train.num_ranks"
            )
    sampler: tuple[int, ...] = ()
    if role in ("both", "sampler"):
        rest = tuple(g for g in range(visible) if g not in trainer)
        sampler = tuple(sampler_gpus) or (
            rest if len(rest) >= sampler_gpus_needed else tuple(range(sampler_gpus_needed))
        )
        if len(sampler) < sampler_gpus_needed:
            raise ConfigError(
                f"rollout.vllm.tensor_parallel_size={sampler_gpus_needed} needs that many GPUs, "
                f"the sampler has {len(sampler)} ({list(sampler)}): set rollout.gpus"
            )
    return Placement(trainer, sampler)


def visible_gpus() -> list[str]:
    """The physical ids of the GPUs this process may use (CUDA_VISIBLE_DEVICES, or all)."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [g.strip() for g in listed.split(",") if g.strip()][:count]


def placement_for(cfg: Config, role: str, visible: int) -> Placement:
    needed = abilities(cfg.rollout.backend).gpus(cfg.rollout)
    return place(
        visible, role, cfg.train.num_ranks, needed, list(cfg.train.gpus), list(cfg.rollout.gpus)
    )


def sampler_memory_fraction(cfg: Config) -> float:
    """The cap for the sampler's HF models (0 = none): the configured one, else the shared-GPU
    default when launch.sh put both roles on one GPU (it says so in GRPO_SHARED_GPU)."""
    if cfg.rollout.gpu_memory_fraction:
        return cfg.rollout.gpu_memory_fraction
    return SHARED_SAMPLER_FRACTION if os.environ.get("GRPO_SHARED_GPU") == "1" else 0.0
