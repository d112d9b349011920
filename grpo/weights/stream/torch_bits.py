"""Between torch tensors and a version image's bit patterns (grpo.weights.stream.image)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from grpo.weights.stream.image import Image

# Each dtype as the signed integer of its width (grpo.weights.stream.frames.BITS), as torch
# views it.
_AS_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.int64: torch.int64,
    torch.int32: torch.int32,
    torch.int16: torch.int16,
    torch.int8: torch.int8,
    torch.uint8: torch.int8,
    torch.bool: torch.int8,
}
_NAMES = {dtype: str(dtype).removeprefix("torch.") for dtype in _AS_BITS}
_BY_NAME = {name: dtype for dtype, name in _NAMES.items()}


def image_from_state(
    version: int, state: Mapping[str, torch.Tensor], bucket_bytes: int, adapter: bool
) -> Image:
    """A host copy of `state` (the trainer steps on while it is served). A tensor sharing its
    storage with one before it (tied embeddings) is left out, as save_pretrained leaves it."""
    seen, tensors = set(), []
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        host = t.detach().to("cpu", copy=True).contiguous()
        bits = host.view(_AS_BITS[host.dtype]).reshape(-1).numpy()
        tensors.append((name, _NAMES[host.dtype], tuple(host.shape), bits))
    return Image.build(version, tensors, bucket_bytes, adapter)


def state_from_image(image: Image) -> dict[str, torch.Tensor]:
    """The image's tensors as torch tensors sharing its memory (load_state_dict copies them)."""
    state = {}
    for spec in image.manifest.specs:
        bits = torch.from_numpy(image.arrays[spec.name])
        state[spec.name] = bits.view(_BY_NAME[spec.dtype]).reshape(spec.shape)
    return state
