"""Between torch tensors and a version image's bit patterns (grpo.weights.stream.image)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from grpo.weights.stream.frames import BITS, plan_buckets
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
    seen, kept = set(), []
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        kept.append((name, t.detach()))
    sizes = [t.numel() * t.element_size() for _, t in kept]
    tensors, flats = [], {}
    for index, (start, end) in enumerate(plan_buckets(sizes, bucket_bytes)):
        raw = [t.reshape(-1).view(torch.uint8) for _, t in kept[start:end]]
        flat = torch.cat(raw).to("cpu").numpy() if len(raw) > 1 else _own(raw[0])
        flats[index] = flat
        at = 0
        for (name, t), size in zip(kept[start:end], sizes[start:end], strict=True):
            bits = np.frombuffer(flat[at : at + size], BITS[_NAMES[t.dtype]], t.numel())
            tensors.append((name, _NAMES[t.dtype], tuple(t.shape), _aligned(bits)))
            at += size
    return Image.build(version, tensors, bucket_bytes, adapter, flats)


def _own(raw: torch.Tensor) -> np.ndarray:
    """A host copy of one tensor's bytes (torch.cat of one would copy it as well)."""
    return raw.to("cpu", copy=True).numpy()


def _aligned(bits: np.ndarray) -> np.ndarray:
    """`bits` as it is when aligned to its itemsize (a view of the bucket's buffer), else a
    copy: a tensor after an odd-sized one of a narrower dtype."""
    return bits if bits.flags.aligned else bits.copy()


def state_from_image(image: Image) -> dict[str, torch.Tensor]:
    """The image's tensors as torch tensors sharing its memory (load_state_dict copies them)."""
    state = {}
    for spec in image.manifest.specs:
        bits = torch.from_numpy(image.arrays[spec.name])
        state[spec.name] = bits.view(_BY_NAME[spec.dtype]).reshape(spec.shape)
    return state
