"""Seconds per GB to broadcast a model's weights from one rank to another, bucket by bucket as
weights.mode collective sends a version: over NCCL between two GPUs where the node has two
(the transport the field's collective weight syncs use), else over gloo between two host
processes (the transport weights.mode collective has today). bench.gpu_check prints it after
its table, for the GPU recipe's model shape; `python -m bench.broadcast` alone.

Each rank is a process of its own (NCCL puts no two ranks on one GPU). Both make the same
random bytes, in buckets sized as a version of the model is cut
(grpo.weights.stream.frames.plan_buckets); rank 0 sends them, rank 1 receives into buffers it
cleared and checks every byte against its own copy after each repetition (the broadcast is
timed, the check is not). The median of `reps` after a warm-up, and its spread.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.common import free_port


def buckets_of(sizes: list[int]) -> list[int]:
    """The bytes of each bucket tensors of `sizes` bytes are cut into, as a version of them
    is (grpo.weights.stream.frames.plan_buckets, weights.bucket_mb)."""
    from grpo.config import Config
    from grpo.weights.stream.frames import plan_buckets

    bucket_bytes = int(Config().weights.bucket_mb * 2**20)
    return [sum(sizes[a:b]) for a, b in plan_buckets(sizes, bucket_bytes)]


def model_sizes(shape: dict, dtype: torch.dtype) -> list[int]:
    """The bytes of each tensor of a model of `shape` (bench.gpu's shapes), its tied head
    listed once as the trainer's image lists it; the model built on the meta device."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**shape), dtype=dtype)
    return [p.numel() * p.element_size() for p in model.parameters()]


def backend_here() -> str:
    return "nccl" if torch.cuda.device_count() >= 2 else "gloo"


def broadcast_numbers(sizes: list[int], reps: int = 3, backend: str = "") -> dict[str, str]:
    """Broadcast buckets of `sizes` bytes from rank 0 to rank 1, `reps` times after a warm-up:
    the backend, the GB, and rank 1's seconds per GB (median and spread)."""
    backend = backend or backend_here()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seconds.json"
        torch.multiprocessing.spawn(_rank, args=(backend, free_port(), sizes, reps, str(out)),
                                    nprocs=2)  # fmt: skip
        seconds = json.loads(out.read_text())
    gb = sum(sizes) / 1e9
    where = "2 GPUs" if backend == "nccl" else "2 host processes"
    return {
        "backend": f"{backend} ({where}, {len(sizes)} buckets)",
        "GB": f"{gb:.3f}",
        "s/GB": f"{statistics.median(seconds) / gb:.3f}",
        "spread s/GB": f"{min(seconds) / gb:.3f}-{max(seconds) / gb:.3f}",
    }


def _rank(rank: int, backend: str, port: int, sizes: list[int], reps: int, out: str) -> None:
    nccl = backend == "nccl"
    device = torch.device(f"cuda:{rank}" if nccl else "cpu")
    if nccl:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))  # fmt: skip
    try:
        generator = torch.Generator().manual_seed(0)
        sent = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator).to(device)
                for n in sizes]  # fmt: skip
        buffers = sent if rank == 0 else [torch.empty_like(t) for t in sent]
        ready = torch.zeros(1, device=device)
        seconds = []
        for rep in range(reps + 1):
            if rank == 1:
                for b in buffers:
                    b.zero_()
            dist.all_reduce(ready)  # both start together
            _sync(device)
            t0 = time.perf_counter()
            for b in buffers:
                dist.broadcast(b, src=0)
            _sync(device)
            if rep:  # the first is the warm-up (connections, NCCL's channels)
                seconds.append(time.perf_counter() - t0)
            if rank == 1 and not all(torch.equal(b, s) for b, s in zip(buffers, sent, strict=True)):
                raise RuntimeError(f"repetition {rep}: rank 1 did not receive what rank 0 sent")
        if rank == 1:
            Path(out).write_text(json.dumps(seconds))
    finally:
        dist.destroy_process_group()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def line(numbers: dict[str, str]) -> str:
    return (f"weights broadcast, {numbers['backend']}: {numbers['s/GB']} s/GB over "
            f"{numbers['GB']} GB (spread {numbers['spread s/GB']})")  # fmt: skip


def model_numbers() -> dict[str, str]:
    """The numbers for the GPU recipe's model: the embedded model's shape, bf16."""
    from bench.gpu import SMOLLM2_135M

    return broadcast_numbers(buckets_of(model_sizes(SMOLLM2_135M, torch.bfloat16)))


def main() -> int:
    print(line(model_numbers()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
