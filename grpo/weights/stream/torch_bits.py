"""Between torch tensors and a version image's bit patterns (grpo.weights.stream.image)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch

from grpo.models.loading import require_same_shapes
from grpo.weights.stream.buffers import BufferPool
from grpo.weights.stream.frames import BITS, Manifest, TensorSpec, plan_buckets
from grpo.weights.stream.image import Image

# The torch dtype of each dtype name a version may hold (grpo.weights.stream.frames.BITS: the
# signed integer each travels as), and back.
_BY_NAME = {name: getattr(torch, name) for name in BITS}
_NAMES = {dtype: name for name, dtype in _BY_NAME.items()}
# One spec object per tensor for every version of a model: its sizes are worked out once, not
# at each version (a LoRA adapter's 240 specs cost a tenth of its sync's budget made afresh).
_spec = lru_cache(maxsize=1 << 16)(TensorSpec)


def image_from_state(
    version: int,
    state: Mapping[str, torch.Tensor],
    bucket_bytes: int,
    adapter: bool,
    pool: BufferPool | None = None,
) -> Image:
    """A host copy of `state` (the trainer steps on while it is served), each bucket's tensors
    copied back to back into one buffer (one copy for the bucket, sent as it is; from `pool`
    where there is one: memory an older version no longer holds). A tensor sharing its
    storage with one before it (tied embeddings) is left out, as save_pretrained leaves it."""
    seen, kept, specs = set(), [], []
    for name, t in state.items():
        shape = tuple(t.shape)
        key = (t.data_ptr(), shape)
        if key in seen and t.numel():
            continue
        seen.add(key)
        kept.append(t)
        specs.append(_spec(name, _NAMES[t.dtype], shape))
    buckets = plan_buckets([s.nbytes for s in specs], bucket_bytes)
    flats = {}
    with torch.no_grad():
        for index, (start, end) in enumerate(buckets):
            flats[index] = _joined(kept[start:end], pool)
    image = Image.of_buckets(version, tuple(specs), buckets, flats, adapter)
    if pool is not None:
        pool.keep_spare(image.manifest.nbytes)
    return image


def _joined(tensors: list[torch.Tensor], pool: BufferPool | None) -> np.ndarray:
    """A host copy of the tensors' bytes back to back: joined in their dtype when they share
    one, with torch's own flattening (what DeepSpeed buckets gradients with: a third faster
    than a view of each joined with torch.cat, for a LoRA adapter's 240 tensors), else as
    bytes; a copy of its own for one tensor (torch.cat of one would copy it as well). Into a
    buffer of `pool`, when given and the bucket is one it pools. Tensors back to back in one
    buffer (a DeepSpeed ZeRO-1/2 rank's parameters, views of its flat group) are copied whole."""
    span = _span(tensors)
    tensors = [span] if span is not None else tensors
    one, nbytes = len({t.dtype for t in tensors}) == 1, sum(t.nbytes for t in tensors)
    if pool is not None and pool.pooled(nbytes):
        out = torch.from_numpy(buf := pool.take(nbytes))
        parts = [t.reshape(-1) if one else t.reshape(-1).view(torch.uint8) for t in tensors]
        out = out.view(tensors[0].dtype) if one else out
        if all(t.device.type == "cpu" for t in parts):
            torch.cat(parts, out=out)
        else:  # joined where the tensors are (unless one already), then one transfer
            out.copy_(parts[0] if len(parts) == 1 else torch.cat(parts))
        return buf
    if len(tensors) == 1:
        return _own(tensors[0].reshape(-1).view(torch.uint8))
    if one:
        joined = torch._utils._flatten_dense_tensors(tensors).view(torch.uint8)
    else:
        joined = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    return joined.to("cpu").numpy()


def _own(raw: torch.Tensor) -> np.ndarray:
    """A host copy of one tensor's bytes (torch.cat of one would copy it as well)."""
    return raw.to("cpu", copy=True).numpy()


def state_from_image(image: Image) -> dict[str, torch.Tensor]:
    """The image's tensors as torch tensors sharing its memory (load_state_dict copies them)."""
    state, specs = {}, image.manifest.specs
    for index, (start, end) in enumerate(image.manifest.buckets):
        flat = _bucket_tensors(image, index, _bucket_whole(image, index))
        state.update((s.name, t.view(s.shape)) for s, t in zip(specs[start:end], flat, strict=True))
    return state


def _bucket_whole(image: Image, index: int) -> torch.Tensor | None:
    """Bucket `index` as one 1-D tensor of its tensors' dtype, sharing the image's memory: where
    the image holds it in one buffer, of one dtype, aligned to it."""
    specs, flat = image.manifest.bucket_specs(index), image.flats.get(index)
    if flat is None or not _one_aligned_dtype(flat, specs):
        return None
    return torch.from_numpy(flat).view(_BY_NAME[specs[0].dtype])


def _bucket_tensors(image: Image, index: int, whole: torch.Tensor | None) -> list[torch.Tensor]:
    """Bucket `index`'s tensors, flat: split from `whole` (_bucket_whole, in one call: a tensor
    from each array costs twice as much, on the clock of every sync of a LoRA adapter's 240
    tensors), else from the image's arrays."""
    specs = image.manifest.bucket_specs(index)
    if whole is not None:
        return list(whole.split([s.size for s in specs]))
    return [torch.from_numpy(image.arrays[s.name]).view(_BY_NAME[s.dtype]) for s in specs]


def _span(targets: list[torch.Tensor]) -> torch.Tensor | None:
    """The one 1-D tensor `targets` make up when they sit back to back in one buffer, in
    order, of one dtype (a LoRA adapter the sampler packed, grpo.models.loading.pack_adapter;
    the trainer's parameters in a DeepSpeed ZeRO-1/2 flat group), else None."""
    first, at = targets[0], targets[0].data_ptr()
    storage = first.untyped_storage().data_ptr()
    for t in targets:
        if (t.dtype, t.device) != (first.dtype, first.device) or not t.is_contiguous():
            return None
        if t.data_ptr() != at or t.untyped_storage().data_ptr() != storage:
            return None
        at += t.nbytes
    return first.as_strided((sum(t.numel() for t in targets),), (1,))


class LoadPlan:
    """Where each tensor of versions cut one way (a manifest's specs and buckets) goes in a
    model's tensors (`targets`, by published name): checked once, when made, against the
    targets' names and shapes (a mismatch refused before anything is copied: all or nothing),
    then each version copied in with one call per bucket: one copy where the bucket's targets
    sit back to back in one buffer, else one multi-tensor copy. Per-tensor calls and checks
    cost a LoRA adapter's 240 tensors a third of its sync's budget."""

    def __init__(
        self, targets: Mapping[str, torch.Tensor], manifest: Manifest, tied: set[str], what: str
    ):
        given = {s.name: s.shape for s in manifest.specs}
        require_same_shapes({n: tuple(t.shape) for n, t in targets.items()}, given, tied, what)
        self.manifest = manifest  # the versions it was made for are cut as this one
        self.device = next(iter(targets.values())).device if targets else None
        # each bucket's targets: the one tensor they make up (else None), and each of them,
        # flat where every one can be viewed so (copied in as the bucket is split), else shaped
        self.buckets: list[tuple[torch.Tensor | None, list[torch.Tensor], bool]] = []
        for index in range(len(manifest.buckets)):
            bucket = [targets[s.name] for s in manifest.bucket_specs(index)]
            shaped = not all(t.is_contiguous() for t in bucket)
            each = bucket if shaped else [t.view(-1) for t in bucket]
            self.buckets.append((_span(bucket), each, shaped))

    def fits(self, manifest: Manifest) -> bool:
        """Whether `manifest` cuts its version as the one this plan was made for."""
        return manifest.cut_like(self.manifest)

    def load(self, image: Image) -> None:
        """`image` (a version this plan fits) into the targets, in place."""
        assert self.fits(image.manifest), "a version cut another way: make a new plan"
        with torch.no_grad():
            for index, (span, each, shaped) in enumerate(self.buckets):
                whole = _bucket_whole(image, index)
                if whole is not None and self.device is not None and self.device.type != "cpu":
                    whole = whole.to(self.device, non_blocking=True)  # one transfer a bucket
                if span is not None and whole is not None:
                    span.copy_(whole)  # converting the dtype where the policy holds another
                    continue
                sources = _bucket_tensors(image, index, whole)
                if shaped:
                    specs = image.manifest.bucket_specs(index)
                    sources = [t.view(s.shape) for t, s in zip(sources, specs, strict=True)]
                # torch's own multi-tensor copy (its optimizers' foreach path): one call for
                # the bucket, converting dtypes where the policy holds another
                torch._foreach_copy_(each, sources)


def _one_aligned_dtype(flat: np.ndarray, specs: tuple[TensorSpec, ...]) -> bool:
    """Whether a bucket's buffer holds tensors of one dtype, starting at an address aligned to
    it (a buffer a socket received may start anywhere)."""
    dtypes = {s.dtype for s in specs}
    return len(dtypes) == 1 and flat.ctypes.data % BITS[specs[0].dtype].itemsize == 0
