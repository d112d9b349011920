"""The weights of a published version, whatever the ZeRO stage.

Under ZeRO-0/1/2 every rank holds the whole parameters and rank 0 saves them alone, with no
collective. Under ZeRO-3 each rank holds a partition: the whole tensors exist only inside a
gather, a collective every rank must enter at the same point, after which rank 0 writes the
same files as under ZeRO-2 (the in-memory layout, sharded at train.max_shard_size, or the LoRA
adapter).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.config import Config
from grpo.models.embedded import portable_name
from grpo.models.loading import adapter_state
from grpo.weights.dirs import publish_version
from grpo.weights.modes import mode_of
from grpo.weights.modes.base import TrainerLink
from grpo.weights.stream.buffers import BufferPool
from grpo.weights.stream.image import Image, load_image, save_image
from grpo.weights.stream.server import VersionStore
from grpo.weights.stream.torch_bits import image_from_state


@dataclass(frozen=True)
class Published:
    """What rank 0 calls inside weights_to_publish (other ranks: never called)."""

    write: Callable[[Path, str], None]  # (dir, max_shard_size): save the weights into dir
    state: Callable[[], dict[str, Any]]  # the tensors themselves (weights.mode: stream)


def publishes_on_every_rank(engine: Any) -> bool:
    """Whether every rank must take part in a publish: ZeRO-3's gather is collective."""
    return bool(engine.zero_optimization_partition_weights())


def publishes_here(engine: Any, rank: int) -> bool:
    """Whether this rank calls the trainer's publish: rank 0, and under ZeRO-3 every rank."""
    return rank == 0 or publishes_on_every_rank(engine)


def _save(module: Any, where: Path, lora: bool, max_shard_size: str, state: dict | None) -> None:
    if lora:
        module.save_pretrained(where)  # the adapter only
    else:  # the in-memory layout, which the sampler's load_state_dict expects
        module.save_pretrained(
            where, state_dict=state, save_original_format=False, max_shard_size=max_shard_size
        )


def name_base(adapter: Path, name: str) -> None:
    """The adapter written in `adapter` names `name` as its base (grpo.models.embedded.
    portable_name), in place of the path peft recorded."""
    path = adapter / "adapter_config.json"
    settings = json.loads(path.read_text())
    settings["base_model_name_or_path"] = name
    path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def _state(module: Any, lora: bool, state: dict | None) -> dict[str, Any]:
    if state is not None:
        return state
    if lora:
        return adapter_state(module)  # the names save_pretrained gives the adapter
    return module.state_dict()


def _published(module: Any, lora: bool, state: dict | None) -> Published:
    return Published(
        lambda where, shard: _save(module, where, lora, shard, state),
        lambda: _state(module, lora, state),
    )


@contextmanager
def weights_to_publish(engine: Any, lora: bool) -> Iterator[Published]:
    """Every rank under ZeRO-3 (see publishes_on_every_rank), else rank 0 alone: yields the
    writer rank 0 calls inside the block.

    ZeRO-3, full weights: the engine's consolidated state dict, gathered one layer at a time
    into rank 0's host memory (never the whole model on one device), tied weights kept tied.
    ZeRO-3, LoRA: only the adapter's (trainable) parameters are gathered, on every rank for the
    time of the block; the frozen base is never gathered."""
    module = engine.module
    if not publishes_on_every_rank(engine):
        yield _published(module, lora, None)
        return
    import deepspeed

    if lora:
        adapter = [p for p in module.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(adapter):  # read only: no broadcast on exit
            yield _published(module, True, None)
        return
    state = engine._zero3_consolidated_16bit_state_dict()  # rank 0's; None on the others
    yield _published(module, False, state)


def new_store(cfg: Config) -> VersionStore | None:
    """The versions rank 0 keeps in memory to serve (weights.mode stream, collective), else
    None."""
    if not mode_of(cfg).from_memory:
        return None
    w = cfg.weights
    budget = int(w.base_memory_mb * 2**20)
    return VersionStore(w.keep_bases, budget, w.delta, protected=versions_samplers_may_ask(cfg))


def versions_samplers_may_ask(cfg: Config) -> int:
    """How many of the newest published versions a sampler may still ask for, a restarted one
    included: its next batch may be sampled with a version up to train.max_staleness steps
    behind the newest, rounded down to a published one (every train.sync_interval steps). The
    store keeps them whatever weights.keep_bases and weights.base_memory_mb say."""
    t = cfg.train
    return (t.max_staleness or 0) // t.sync_interval + 2


def stream_image(
    cfg: Config, version: int, state: dict[str, Any], pool: BufferPool | None = None
) -> Image:
    bucket_bytes = int(cfg.weights.bucket_mb * 2**20)
    return image_from_state(version, state, bucket_bytes, cfg.model.lora.enabled, pool)


def durable_due(cfg: Config, step: int) -> bool:
    """Whether a streamed version is also written as a version dir: every
    weights.save_interval steps, and the last."""
    every = cfg.weights.save_interval
    return step == cfg.train.total_steps or bool(every and step % every == 0)


class Publisher:
    """Rank 0's publishing of a version: into memory where the mode serves from there
    (weights.mode stream, collective), into a version dir where the samplers read dirs or one
    is due, and then to the mode's trainer end (grpo.weights.modes), which serves it and says
    so in the trainer's heartbeats."""

    def __init__(self, cfg: Config, tokenizer: Any):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.store = new_store(cfg)
        self.end = mode_of(cfg).trainer_end(cfg, self.store)
        # the versions' host memory, reused once the store and the samplers are done with it
        self.pool = BufferPool() if self.store is not None else None

    def start(self, link: TrainerLink) -> None:
        """The samplers can be told of versions from now on."""
        self.end.start(link)

    def announced(self) -> dict[str, Any]:
        """What every heartbeat of the trainer says of the versions (their identities, the
        collective group)."""
        return self.end.announced()

    def publish(self, weights: Published, step: int) -> None:
        cfg = self.cfg
        if self.store is not None:  # in memory first: the samplers wait for it
            self.store.add(stream_image(cfg, step, weights.state(), self.pool))
        self.end.published(step)
        if self.store is None or durable_due(cfg, step):

            def save(tmp: Path) -> None:
                weights.write(tmp, cfg.train.max_shard_size)
                self.tokenizer.save_pretrained(tmp)
                if cfg.model.lora.enabled:
                    name_base(tmp, portable_name(cfg.model.path))

            publish_version(cfg.run_dir, step, save, cfg.train.keep_versions, step)

    def keep_for_resume(self, step: int) -> Callable[[Path], None] | None:
        """What the state of `step` saves beside the engines (grpo.trainer.state.save): the
        versions before it still in memory (weights.mode stream, collective). A sampler whose
        batch may lag that state's version by train.max_staleness asks a resumed trainer for
        them, which it can then serve bit for bit, though it never saw them published."""
        if self.store is None:
            return None
        store = self.store

        def keep(where: Path) -> None:
            (where / "versions").mkdir(exist_ok=True)
            for image in store.images_before(step):
                save_image(image, where / "versions" / f"v{image.version:06d}.safetensors")

        return keep

    def restore(self, where: Path) -> None:
        """A resumed trainer's: the versions its state kept (keep_for_resume) back in memory,
        before it republishes its own."""
        if self.store is not None:
            restore_versions(self.store, where / "versions", self.cfg.transport.max_version_bytes)

    def close(self) -> None:
        self.end.close()


def restore_versions(store: VersionStore, versions: Path, max_bytes: int) -> None:
    """The versions a state kept (keep_for_resume) into `store`, oldest first; one that does not
    read back as itself (changed on disk, or kept by code that wrote another manifest) stops the
    resume with one line saying how to go on without them."""
    for path in sorted(versions.glob("v*.safetensors")):
        try:
            image = load_image(path, max_bytes)
        except ValueError as e:
            raise ValueError(
                f"{e}; remove {versions} to resume without the versions this state kept"
            ) from None
        store.add(image)


def keep_initial(engine: Any, cfg: Config, store: VersionStore | None) -> None:
    """weights.mode: stream: version 0 (the initial weights) into rank 0's store, unannounced:
    the samplers start from the same weights, so the first version travels as a delta from it.
    Every rank under ZeRO-3 (the gather is collective), like a publish."""
    if not mode_of(cfg).from_memory:
        return
    with weights_to_publish(engine, cfg.model.lora.enabled) as weights:
        if store is not None:
            store.add(stream_image(cfg, 0, weights.state()))
