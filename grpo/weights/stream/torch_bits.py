"""Between torch tensors and a version image's bit patterns (grpo.weights.stream.image)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from grpo.weights.stream.frames import BITS, TensorSpec, plan_buckets
from grpo.weights.stream.image import Image

# The torch dtype of each dtype name a version may hold (grpo.weights.stream.frames.BITS: the
# signed integer each travels as), and back.
_BY_NAME = {name: getattr(torch, name) for name in BITS}
_NAMES = {dtype: name for name, dtype in _BY_NAME.items()}


def image_from_state(
    version: int, state: Mapping[str, torch.Tensor], bucket_bytes: int, adapter: bool
) -> Image:
    """A host copy of `state` (the trainer steps on while it is served), each bucket's tensors
    copied back to back into one buffer (one copy for the bucket, sent as it is). A tensor
    sharing its storage with one before it (tied embeddings) is left out, as save_pretrained
    leaves it."""
    seen, kept, specs = set(), [], []
    for name, t in state.items():
        shape = tuple(t.shape)
        key = (t.data_ptr(), shape)
        if t.numel() and key in seen:
            continue
        seen.add(key)
        kept.append(t.detach())
        specs.append(TensorSpec(name, _NAMES[t.dtype], shape))
    buckets = plan_buckets([t.nbytes for t in kept], bucket_bytes)
    flats = {}
    for index, (start, end) in enumerate(buckets):
        flats[index] = _joined(kept[start:end])
    return Image.of_buckets(version, tuple(specs), buckets, flats, adapter)


def _joined(tensors: list[torch.Tensor]) -> np.ndarray:
    """A host copy of the tensors' bytes back to back: joined in their dtype when they share
    one (a view each fewer), else as bytes; a copy of its own for one tensor (torch.cat of one
    would copy it as well)."""
    if len(tensors) == 1:
        return _own(tensors[0].reshape(-1).view(torch.uint8))
    if len({t.dtype for t in tensors}) == 1:
        joined = torch.cat([t.reshape(-1) for t in tensors]).view(torch.uint8)
    else:
        joined = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    return joined.to("cpu").numpy()


def _own(raw: torch.Tensor) -> np.ndarray:
    """A host copy of one tensor's bytes (torch.cat of one would copy it as well)."""
    return raw.to("cpu", copy=True).numpy()


def state_from_image(image: Image) -> dict[str, torch.Tensor]:
    """The image's tensors as torch tensors sharing its memory (load_state_dict copies them).
    A bucket of one dtype held in one buffer is split in one call: a tensor from each array
    costs twice as much, on the clock of every sync (a LoRA adapter is 240 tensors)."""
    state, m = {}, image.manifest
    for index, (start, end) in enumerate(m.buckets):
        specs, flat = m.specs[start:end], image.flats.get(index)
        if flat is not None and _one_aligned_dtype(flat, specs):
            parts = torch.from_numpy(flat).view(_BY_NAME[specs[0].dtype])
            sized = parts.split([s.size for s in specs])
            state.update((s.name, t.view(s.shape)) for s, t in zip(specs, sized, strict=True))
            continue
        for s in specs:
            bits = torch.from_numpy(image.arrays[s.name])
            state[s.name] = bits.view(_BY_NAME[s.dtype]).reshape(s.shape)
    return state


def _one_aligned_dtype(flat: np.ndarray, specs: tuple[TensorSpec, ...]) -> bool:
    """Whether a bucket's buffer holds tensors of one dtype, starting at an address aligned to
    it (a buffer a socket received may start anywhere)."""
    dtypes = {s.dtype for s in specs}
    return len(dtypes) == 1 and flat.ctypes.data % BITS[specs[0].dtype].itemsize == 0
