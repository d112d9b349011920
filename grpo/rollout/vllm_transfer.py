"""Weights into a running vLLM engine through vLLM's own weight-transfer API
(`vllm.distributed.weight_transfer`), with an engine of ours registered at runtime.

vLLM's built-in engines move weights from a trainer that drives the transfer (NCCL broadcast,
CUDA IPC handles). Here the sampler already holds each version (a files-mode version dir, or a
streamed or broadcast image in its memory), so the engine it needs reads safetensors files that
the sampler names: a version dir's files as they are, a streamed version written once into an
anonymous memory file (memfd: nothing is left behind if the sampler dies) that the worker maps.
The tensors never cross vLLM's RPC pipe (before this, a streamed version was pickled through it
whole), and both modes load through the same three calls: `start_weight_update`,
`update_weights`, `finish_weight_update` (vLLM's layerwise reload: fused and CPU-repacked layouts
redone at the end).

This module holds what both sides share and the sampler's side, free of vLLM imports; the
engine itself is `grpo.rollout.vllm_worker.SafetensorsFilesEngine`, registered when vLLM imports
that module in its worker (before the worker loads its model and creates its transfer engine).
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping
from typing import Any

import torch

BACKEND = "grpo_safetensors_files"
ALIGN = 64  # the data start, after the header

_DTYPES = {  # torch dtype -> the safetensors name (the format's own table)
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


# ---------------------------------------------------------------------------- sampler side


def write_memfd(state: Mapping[str, torch.Tensor], version: int) -> int:
    """`state` as one safetensors file in an anonymous memory file; returns its descriptor
    (the caller closes it). One copy of every tensor, straight into the mapping."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "version": str(version)}}
    # Back to back (the format allows no gaps), widest elements first: then every tensor starts
    # at a multiple of its element size, as safetensors' own writer orders them.
    order = sorted(state, key=lambda name: -state[name].element_size())
    offset = 0
    for name in order:
        t = state[name]
        if t.dtype not in _DTYPES:
            raise RuntimeError(f"version {version}: tensor {name} has dtype {t.dtype}")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-(len(encoded) + 8) % ALIGN)  # data starts aligned too (spaces are legal)
    start = 8 + len(encoded)
    fd = os.memfd_create(f"grpo-v{version}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, start + offset)
        with mmap.mmap(fd, start + offset) as mem:
            mem[:8] = len(encoded).to_bytes(8, "little")
            mem[8:start] = encoded
            view = torch.frombuffer(mem, dtype=torch.uint8)
            for name in order:
                lo, hi = header[name]["data_offsets"]
                if hi > lo:
                    flat = state[name].detach().contiguous().reshape(-1).view(torch.uint8)
                    view[start + lo : start + hi].copy_(flat)
            del view  # the mapping cannot close while a tensor still exports it
    except BaseException:
        os.close(fd)
        raise
    return fd


def memfd_path(fd: int) -> str:
    """A path another process of the same user opens the memory file by (while `fd` is open)."""
    return f"/proc/{os.getpid()}/fd/{fd}"


def update_request(files: list[str], version: int) -> dict[str, Any]:
    """What one `update_weights` call carries: every file of the version, loaded in one call so
    that the worker checks them all before it copies anything."""
    return {"files": list(files), "version": version}
