"""The trainer's sections of the config tree: optimisation and publishing (`train`), PPO's
critic, and the DeepSpeed file train.deepspeed_config names; each with the checks of its own
values (those that read other sections too are grpo.config.rules')."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo.config.errors import ConfigError
from grpo.config.fields import knob, require_gpu_list, require_signs

# What save_pretrained's max_shard_size accepts: a whole number and a unit.
_SHARD_SIZE = re.compile(r"\d+[GMK]i?B", re.IGNORECASE)


@dataclass
class TrainConfig:
    total_steps: int = knob(10, "optimizer steps (one received batch each)")
    lr: float = knob(1e-6, "learning rate (AdamW)")
    lr_warmup_steps: int = knob(
        0, "optimizer steps over which the learning rate rises linearly from 0 to train.lr"
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = knob(
        "constant",
        "after the warmup: constant, or decaying (linearly, or along a half cosine) to "
        "train.lr_min_ratio x train.lr at the run's last optimizer step",
    )
    lr_min_ratio: float = knob(0.0, "the decaying schedules' last learning rate, as a share of lr")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    max_grad_norm: float = knob(1.0, "gradient clipping norm")
    micro_batch_size: int = knob(4, "sequences per forward/backward; the rest is accumulated")
    max_tokens_per_micro_batch: int = knob(
        0,
        "fill each micro-batch up to this many computed tokens instead of micro_batch_size "
        "sequences (0 = off; a longer sequence gets a micro-batch of its own)",
    )
    packing: Literal["auto", "packed", "padded"] = knob(
        "auto",
        "packed: a micro-batch's sequences back to back in one row, positions restarting, no "
        "padding computed; padded: a rectangle. Same numbers. auto = packed with a "
        "flash_attention kernel (varlen), padded otherwise: sdpa and eager compute the whole "
        "packed row's square attention mask, which costs more than the padding saves",
    )
    mini_batch_size: int = knob(
        0, "sequences per optimizer step, all ranks together; 0 = the whole received batch"
    )
    ppo_epochs: int = knob(
        1, "passes over each received batch (each pass: one step per mini-batch)"
    )
    num_ranks: int = knob(
        1, "trainer processes per node (one per GPU on GPU, CPU processes on CPU)"
    )
    nnodes: int = knob(
        1, "nodes the trainer spans (torchrun's --nnodes); world = nnodes * num_ranks"
    )
    node_rank: int = knob(0, "this node's index among the trainer's nodes; node 0 hosts rank 0")
    master_addr: str = knob(
        "127.0.0.1", "address of trainer node 0, where the ranks meet (torchrun's --master_addr)"
    )
    gpus: list[int] = knob(
        [],
        "GPU indices (of those visible) the trainer's ranks use, one per rank; [] = the first "
        "num_ranks (see docs/gpus.md)",
    )
    deepspeed_config: str = knob(
        "configs/deepspeed/zero2.json",
        "DeepSpeed JSON: zero2.json, zero3.json (parameters partitioned over the ranks), "
        "zero2_offload.json / zero3_offload.json (CPU offload) in configs/deepspeed/; see "
        "docs/gpus.md",
    )
    master_port: int = knob(29500, "port of the trainer ranks' rendezvous")
    sync_interval: int = knob(1, "publish weights for the sampler every N steps")
    max_staleness: int | None = knob(
        None,
        "batch k is sampled with version k - this (0 = on-policy, 1 = sampling overlaps "
        "training); null = 1 where that is safe: the sampler scores the old log-probs with "
        "the weights that sampled (logprobs_on: sampler), so the ratio corrects the lag; "
        "else 0",
    )
    keep_versions: int = knob(3, "published weight versions kept on disk")
    max_shard_size: str = knob(
        "5GB",
        "largest safetensors file of a published version (save_pretrained's max_shard_size, "
        "e.g. 2GB, 500MB): a larger model is published as several files and an index",
    )
    state_interval: int = knob(
        50,
        "save the training state (model, optimizer, step, ledger) every N steps and at the end "
        "(0 = at the end only); batches are acknowledged to the sampler once saved",
    )
    resume: Literal["never", "auto", "always"] = knob(
        "never",
        "continue from the run dir's training state and the sampler's spool: auto = if there "
        "is one, always = it must exist (--resume); never = a new run",
    )
    seed: int = knob(0, "trainer seed")
    logprobs_on: Literal["sampler", "trainer"] = knob(
        "sampler",
        "who computes the old-policy and reference log-probs: the sampler (HF "
        "forwards next to the engine, with the weights that sampled) or the trainer ranks "
        "(before the first update, with the current weights; the sampler then loads no HF "
        "models)",
    )


@dataclass
class CriticConfig:
    model_path: str = knob("", "value model's base (a scalar head is added); '' = model.path")
    lr: float = knob(1e-5, "critic learning rate")
    value_clip: float = knob(0.2, "clip of the value change per update (PPO's clipped value loss)")
    warmup_steps: int = knob(0, "first steps train only the critic (the policy waits)")


def check_train(t: TrainConfig) -> None:
    require_signs(
        "train",
        t,
        (
            "total_steps",
            "lr",
            "micro_batch_size",
            "ppo_epochs",
            "num_ranks",
            "nnodes",
            "sync_interval",
            "keep_versions",
        ),
        ("max_staleness", "max_tokens_per_micro_batch", "state_interval", "weight_decay"),
    )
    if t.max_grad_norm <= 0:
        raise ConfigError(f"train.max_grad_norm must be > 0, got {t.max_grad_norm!r}")
    if not 0 <= t.master_port <= 65535:  # 0: any free port
        raise ConfigError(f"train.master_port must be a TCP port (0-65535), got {t.master_port}")
    if t.lr_warmup_steps < 0 or not 0.0 <= t.lr_min_ratio <= 1.0:
        raise ConfigError(
            "train.lr_warmup_steps must be >= 0 and train.lr_min_ratio in [0, 1], got "
            f"{t.lr_warmup_steps} and {t.lr_min_ratio}"
        )
    # The sampler loads the newest announced version while the trainer may publish up to
    # max_staleness + 1 more; the one being loaded must not be pruned meanwhile.
    needed = t.max_staleness // t.sync_interval + 2
    if t.keep_versions < needed:
        raise ConfigError(
            f"train.keep_versions must be >= {needed} with max_staleness "
            f"{t.max_staleness} and sync_interval {t.sync_interval}, got "
            f"{t.keep_versions}: a version could be deleted while the sampler loads it"
        )
    if not _SHARD_SIZE.fullmatch(t.max_shard_size):
        raise ConfigError(
            f"train.max_shard_size must be a size such as 5GB or 500MB, got {t.max_shard_size!r}"
        )
    if not 0 <= t.node_rank < t.nnodes:
        raise ConfigError(
            f"train.node_rank must be in [0, train.nnodes={t.nnodes}), got {t.node_rank}"
        )
    require_gpu_list("train.gpus", t.gpus)
    if t.gpus and len(t.gpus) != t.num_ranks:
        raise ConfigError(
            f"train.gpus lists {len(t.gpus)} GPUs for train.num_ranks={t.num_ranks} ranks: "
            "give one per rank, or [] for the first num_ranks"
        )
    check_deepspeed(t.deepspeed_config)


def check_critic(c: CriticConfig) -> None:
    if c.lr <= 0 or c.value_clip <= 0 or c.warmup_steps < 0:
        raise ConfigError("critic.lr and critic.value_clip must be > 0, warmup_steps >= 0")


def check_deepspeed(path: str) -> None:
    """The ZeRO settings of train.deepspeed_config that the trainer supports. A missing file
    is left to the trainer, which reports it: a sampler's node need not have it."""
    try:
        ds = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return
    except OSError as e:  # a directory, a device, no permission
        raise ConfigError(f"train.deepspeed_config: cannot read {path!r} ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"train.deepspeed_config: {path} is not valid JSON ({e})") from None
    where = f"train.deepspeed_config {path}"
    zero = ds.get("zero_optimization", {}) if isinstance(ds, dict) else None
    if not isinstance(zero, dict):
        raise ConfigError(f"{where}: expected a JSON object with a zero_optimization object")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    offloads = set()
    for kind in ("offload_optimizer", "offload_param"):
        section = zero.get(kind) or {}
        device = section.get("device", "none") if isinstance(section, dict) else section
        if device not in ("none", "cpu"):
            raise ConfigError(
                f"{where}: zero_optimization.{kind}.device {device!r} is not supported (NVMe "
                "offload is untested here): use cpu or none"
            )
        if device == "cpu":
            offloads.add(kind)
    if "offload_param" in offloads and stage != 3:
        raise ConfigError(
            f"{where}: zero_optimization.offload_param needs stage 3 (stage {stage} keeps the "
            "whole parameters on every rank and DeepSpeed would ignore it): use "
            "configs/deepspeed/zero3_offload.json, or drop offload_param"
        )
    if "offload_optimizer" in offloads and stage == 0:
        raise ConfigError(
            f"{where}: zero_optimization.offload_optimizer needs stage 1, 2 or 3: use "
            "configs/deepspeed/zero2_offload.json"
        )
