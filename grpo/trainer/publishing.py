"""The weights of a published version, whatever the ZeRO stage.

Under ZeRO-0/1/2 every rank holds the whole parameters and rank 0 saves them alone, with no
collective. Under ZeRO-3 each rank holds a partition: the whole tensors exist only inside a
gather, a collective every rank must enter at the same point, after which rank 0 writes the
same files as under ZeRO-2 (the in-memory layout, sharded at train.max_shard_size, or the LoRA
adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# write(dir, max_shard_size): rank 0 saves the weights into dir (other ranks: never called).
WeightWriter = Callable[[Path, str], None]


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


@contextmanager
def weights_to_publish(engine: Any, lora: bool) -> Iterator[WeightWriter]:
    """Every rank under ZeRO-3 (see publishes_on_every_rank), else rank 0 alone: yields the
    writer rank 0 calls inside the block.

    ZeRO-3, full weights: the engine's consolidated state dict, gathered one layer at a time
    into rank 0's host memory (never the whole model on one device), tied weights kept tied.
    ZeRO-3, LoRA: only the adapter's (trainable) parameters are gathered, on every rank for the
    time of the block; the frozen base is never gathered."""
    module = engine.module
    if not publishes_on_every_rank(engine):
        yield lambda where, shard: _save(module, where, lora, shard, None)
        return
    import deepspeed

    if lora:
        adapter = [p for p in module.parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters(adapter):  # read only: no broadcast on exit
            yield lambda where, shard: _save(module, where, True, shard, None)
        return
    state = engine._zero3_consolidated_16bit_state_dict()  # rank 0's; None on the others
    yield lambda where, shard: _save(module, where, False, shard, state)
