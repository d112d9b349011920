"""Small collective helpers shared by the policy and the critic."""

import torch
import torch.distributed as dist


def comm_device() -> torch.device:
    """Where collective tensors live: nccl only moves CUDA tensors, gloo CPU ones."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_across_ranks(t: torch.Tensor) -> torch.Tensor:
    t = t.to(comm_device())
    dist.all_reduce(t)
    return t.cpu()
