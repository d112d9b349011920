"""Small collective helpers shared by the policy and the critic."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.core.batching import length_order, micro_batch_ranges, split_to_count
from grpo.core.episode import Episode

# How gloo reports a peer rank that hung past the timeout or went away; nccl raises
# torch.distributed.DistError subclasses.
_GLOO_FAILURES = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer")


def collective_timeout_s(cfg: Config) -> float:
    """How long a trainer rank waits in a collective: rank 0 may first wait that long for a
    sampler, while the others wait for rank 0."""
    return cfg.transport.startup_timeout_s + cfg.transport.peer_timeout_s


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


def micro_batches(eps: Sequence[Episode], cfg: Config, micro: int) -> list[list[int]]:
    """Micro-batches of `eps` as lists of indices: sequences of similar length together, `micro`
    of them each or filled up to train.max_tokens_per_micro_batch; every rank gets as many
    micro-batches as the rank with the most."""
    sizes = [(len(e.prompt_ids), len(e.completion_ids)) for e in eps]
    order = length_order(sizes)
    ranges = micro_batch_ranges(
        [sizes[i] for i in order], micro, cfg.train.max_tokens_per_micro_batch, cfg.packed
    )
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
