"""The trainer's DeepSpeed engines: their configuration (the JSON file's ZeRO settings with the
batch geometry and optimiser values of our config), the policy's and, under ZeRO-3, the
reference model's.

Under ZeRO-3 (configs/deepspeed/zero3*.json) every parameter is partitioned over the ranks: a
forward pass all-gathers each layer's parameters as it reaches it, so every rank must run the
same number of forward passes in the same order, and only a collective gather (grpo.trainer.
publishing) sees whole tensors.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grpo.config import Config
from grpo.models.loading import apply_lora, load_causal_lm, load_reference
from grpo.trainer.schedule import scheduler_for

log = logging.getLogger("grpo.trainer")


def deepspeed_config(cfg: Config, world: int, seqs_per_step: int) -> dict[str, Any]:
    """The JSON file's settings with the batch geometry and optimiser values from our config;
    `seqs_per_step` is one rank's sequences per optimizer step (its mini-batch)."""
    path = Path(cfg.train.deepspeed_config)
    try:
        ds = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"train.deepspeed_config: no file {path}") from None
    micro = min(cfg.train.micro_batch_size, seqs_per_step)
    gas = math.ceil(seqs_per_step / micro)
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["gradient_accumulation_steps"] = gas
    ds["train_batch_size"] = micro * gas * world
    ds["gradient_clipping"] = cfg.train.max_grad_norm
    ds["bf16"] = {"enabled": cfg.model.dtype == "bfloat16"}  # fp32 master weights either way
    params = ds.setdefault("optimizer", {"type": "AdamW"}).setdefault("params", {})
    params.update(lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    return ds


def zero_stage(ds: dict[str, Any]) -> int:
    return int(ds.get("zero_optimization", {}).get("stage", 0))


@contextmanager
def partitioned_loading(ds: dict[str, Any]) -> Iterator[None]:
    """Under ZeRO-3, models that transformers loads inside this block are built already
    partitioned (deepspeed.zero.Init, which transformers applies while an HfDeepSpeedConfig
    is alive): no rank ever holds the whole model, in host or device memory. Without it each
    rank would load the whole model and deepspeed.initialize would move it whole onto the
    rank's device before partitioning it. Elsewhere a no-op."""
    if zero_stage(ds) != 3:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig

    alive = HfDeepSpeedConfig(ds)  # transformers keeps only a weak reference to it
    try:
        yield
    finally:
        del alive


def import_deepspeed_muon_uncompiled(ds: dict[str, Any]) -> None:
    """deepspeed.initialize imports DeepSpeed's Muon optimizer module for an isinstance check,
    and that module wraps its functions in torch.compile as it is imported, which loads all of
    Inductor (and sympy, networkx, triton): about 1.4 s of CPU in every rank's start-up, for
    an optimizer these runs do not use. Imported once here with Dynamo off, the decorators are
    no-ops; a DeepSpeed config that asks for Muon keeps them."""
    if "muon" in str(ds.get("optimizer", {}).get("type", "")).lower():
        return
    before = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # read by torch.compile when it is called
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    finally:
        if before is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = before


def policy_engine(cfg: Config, model_path: Path, world: int) -> tuple[Any, int]:
    """The policy as a DeepSpeed engine in train mode, and its embedding's vocabulary size."""
    import deepspeed

    ds = deepspeed_config(cfg, world, cfg.mini_batch_seqs(world))
    # Start-up says what it does (it was silent for 15-60 s); rank 0's line only (its level).
    log.info("trainer: loading the policy from %s into DeepSpeed (%d rank(s))", model_path, world)
    with partitioned_loading(ds):  # peft, too, asks transformers whether ZeRO-3 is on
        model = load_causal_lm(model_path, cfg.model.dtype, cfg.model.attn_implementation)
        vocab_size = model.get_input_embeddings().num_embeddings
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if cfg.model.lora.enabled:
            model = apply_lora(model, cfg.model.lora)
    import_deepspeed_muon_uncompiled(ds)
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds,
        lr_scheduler=scheduler_for(cfg, world),
    )
    engine.train()  # from_pretrained returns eval mode: no checkpointing, no dropout
    return engine, vocab_size


def reference_model(
    cfg: Config, model_path: Path, ds: dict[str, Any], device: torch.device
) -> torch.nn.Module:
    """The frozen reference on the trainer's ranks: a whole copy on each rank's device, or under
    ZeRO-3 partitioned like the policy (a DeepSpeed engine without an optimizer, whose
    forward gathers the parameters; the policy's parameter offload applies to it too)."""
    if zero_stage(ds) != 3:
        return load_reference(model_path, cfg.model.dtype, cfg.model.attn_implementation).to(device)
    import deepspeed

    inference = {k: v for k, v in ds.items() if k not in ("optimizer", "gradient_clipping")}
    zero = dict(ds["zero_optimization"])
    zero.pop("offload_optimizer", None)  # there is no optimizer
    inference["zero_optimization"] = zero
    with partitioned_loading(inference):
        model = load_reference(model_path, cfg.model.dtype, cfg.model.attn_implementation)
    engine, *_ = deepspeed.initialize(model=model, config=inference)
    engine.eval()
    return engine.module
