"""What the trainer ranks do together: broadcast each received batch, sum and gather across
ranks, plan micro-batches every rank can run, and name a failed collective in our words."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from grpo.config import TransportConfig
from grpo.core.batching import length_order, micro_batch_ranges, split_to_count
from grpo.core.episode import EpisodeBatch
from grpo.wire.blobs import bytes_to_frames, frames_to_bytes
from grpo.wire.channels import PeerError
from grpo.wire.codec import decode, encode_batch

# How gloo reports a peer rank that hung past the timeout or went away; nccl raises
# torch.distributed.DistError subclasses.
_GLOO_FAILURES = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer")


def collective_timeout_s(transport: TransportConfig) -> float:
    """How long a trainer rank waits in a collective: rank 0 may first wait that long for a
    sampler, while the others wait for rank 0."""
    return transport.startup_timeout_s + transport.peer_timeout_s


def collective_failure(error: BaseException, rank: int, timeout_s: float) -> str | None:
    """Our one-line account of a failed collective among the trainer ranks, or None when
    `error` is something else. Torch's own text names a C++ source line, not the cause."""
    if not isinstance(error, RuntimeError):
        return None
    text = str(error)
    if not (isinstance(error, dist.DistError) or any(s in text for s in _GLOO_FAILURES)):
        return None
    detail = text.splitlines()[0].split("] ", 1)[-1].split(". ")[0] if text else "no text"
    if "timed out" in text.lower() or "timeout" in text.lower():
        cause = (
            f"the limit is transport.startup_timeout_s + peer_timeout_s = {timeout_s:.0f} s. "
            "Another rank hung or died: its log says why. If one step legitimately takes "
            "longer, raise transport.peer_timeout_s"
        )
    else:
        cause = "another rank went away: its log says why"
    return f"rank {rank} gave up waiting for the other trainer ranks ({detail}); {cause}"


def comm_device() -> torch.device:
    """Where collective tensors live: nccl only moves CUDA tensors, gloo CPU ones."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_across_ranks(t: torch.Tensor) -> torch.Tensor:
    t = t.to(comm_device())
    dist.all_reduce(t)
    return t.cpu()


def max_across_ranks(t: torch.Tensor) -> torch.Tensor:
    t = t.to(comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu()


def gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Each rank's (n, C) rows of the same shape, back to back in rank order: (world * n, C)."""
    t = t.contiguous().to(comm_device())
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.cat(out).cpu()


def micro_batches(
    sizes: Sequence[tuple[int, int]], micro: int, max_tokens: int, packed: bool
) -> list[list[int]]:
    """Micro-batches of the episodes with (prompt, completion) `sizes`, as lists of indices:
    sequences of similar length together, `micro` of them each or filled up to `max_tokens`
    (train.max_tokens_per_micro_batch); every rank gets as many micro-batches as the rank with
    the most."""
    order = length_order(sizes)
    ranges = micro_batch_ranges([sizes[i] for i in order], micro, max_tokens, packed)
    count = int(max_across_ranks(torch.tensor([float(len(ranges))])))
    return [order[a:b] for a, b in split_to_count(ranges, count)]


def accumulate_backward(engine, loss: torch.Tensor, last: bool) -> None:
    """Backward of one micro-batch; the optimizer steps after the `last` one.

    The boundary is set explicitly because the number of micro-batches varies with the token
    budget, and DeepSpeed's division of the loss by its configured accumulation steps is
    undone, since the caller already weights each micro-batch by its share."""
    engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss * engine.gradient_accumulation_steps())
    engine.step()


# Broadcast in place of a blob length: rank 0 is ending the run / is still waiting / is done
# waiting alone (wait_for_rank0).
STOP, KEEPALIVE, GO_ON = -1, -2, -3


def size_from_rank0() -> int:
    """Every rank but 0: the first size rank 0 broadcasts that is not a KEEPALIVE."""
    size = KEEPALIVE
    while size == KEEPALIVE:
        size = broadcast_size(0)
    return size


def wait_for_rank0() -> None:
    """Every rank but 0: wait while rank 0 alone waits for a peer (the sampler's evaluation
    answers), kept alive by its KEEPALIVEs, until it sends GO_ON; PeerError on its STOP."""
    if size_from_rank0() == STOP:
        raise PeerError("rank 0 ended the run")


def broadcast_size(value: int) -> int:
    size = torch.tensor([value], dtype=torch.long, device=comm_device())
    dist.broadcast(size, src=0)
    return int(size)


def broadcast_batch(
    batch: EpisodeBatch | None, rank: int, max_frame_bytes: int
) -> EpisodeBatch | None:
    """Rank 0's batch to every rank as one uint8 tensor; None (from rank 0) means stop.

    The other ranks wait here while rank 0 waits for the sampler; rank 0 sends KEEPALIVE now
    and then so that their collective does not time out during a long generation.
    """
    if rank != 0:
        if (size := size_from_rank0()) == STOP:
            return None
        buf = torch.empty(size, dtype=torch.uint8, device=comm_device())
        dist.broadcast(buf, src=0)
        return decode(bytes_to_frames(buf.cpu().numpy()), max_frame_bytes=max_frame_bytes)  # type: ignore[return-value]
    if batch is None:
        broadcast_size(STOP)
        return None
    blob = frames_to_bytes(encode_batch(batch))
    broadcast_size(len(blob))
    dist.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(comm_device()), src=0)
    return batch


def average_across_ranks(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    total = sum_across_ranks(torch.tensor([values[k] for k in keys], dtype=torch.float64))
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, total, strict=True)}


def gather_group_ids(batch: EpisodeBatch) -> list[list[int]]:
    ids = torch.tensor([g[0].group_id for g in batch.groups()], dtype=torch.long)
    ids = ids.to(comm_device())
    out = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
    dist.all_gather(out, ids)
    return [t.tolist() for t in out]
