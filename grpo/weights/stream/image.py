"""A weights version in host memory (an `Image`), its buckets encoded against a base, and the
staging copy a receiver fills bucket by bucket and turns into an Image only when every tensor
and the version as a whole match their checksums: all or nothing.

Tensors are held as flat arrays of their bit patterns (grpo.weights.stream.frames.BITS), so this
module needs no torch: relays and benchmarks run it without a model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from grpo.weights.stream import deltas
from grpo.weights.stream.frames import Bucket, Manifest, TensorSpec, encode_bucket, plan_buckets

FULL_COPY = -1  # the base of a bucket of full copies


class ApplyError(ValueError):
    """A bucket that cannot go into the staging copy (it is left as it was)."""


@dataclass
class Image:
    manifest: Manifest
    arrays: dict[str, np.ndarray]  # name -> flat bit pattern
    # bucket index -> its tensors' bytes back to back, where `arrays` are views of one buffer
    # (built or received so): sent as a full-copy bucket's payload without joining the parts
    flats: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.manifest.version

    @classmethod
    def build(
        cls,
        version: int,
        tensors: Iterable[tuple[str, str, tuple[int, ...], np.ndarray]],
        bucket_bytes: int,
        adapter: bool = False,
        flats: dict[int, np.ndarray] | None = None,
    ) -> Image:
        """From (name, dtype name, shape, flat bit array) in the order they will travel;
        `flats`: the buckets' buffers the arrays are views of (plan_buckets' cut)."""
        specs, arrays = [], {}
        for name, dtype, shape, bits in tensors:
            specs.append(TensorSpec(name, dtype, tuple(shape), deltas.tensor_digest(bits)))
            arrays[name] = bits
        buckets = plan_buckets([s.nbytes for s in specs], bucket_bytes)
        return cls(Manifest(version, tuple(specs), buckets, adapter), arrays, flats or {})

    def bucket_bytes(self, index: int) -> np.ndarray:
        """Bucket `index`'s tensors back to back, as uint8: its buffer where the image has one,
        else the tensors joined (an image read from a file, or staged from deltas)."""
        if (flat := self.flats.get(index)) is not None:
            return flat
        parts = [self.arrays[s.name].view(np.uint8) for s in self.manifest.bucket_specs(index)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def compatible(self, manifest: Manifest) -> bool:
        """Whether this image can be a delta base for `manifest`'s tensors: the same names,
        dtypes and shapes (a version of the same model)."""
        mine = [(s.name, s.dtype, s.shape) for s in self.manifest.specs]
        return mine == [(s.name, s.dtype, s.shape) for s in manifest.specs]


def encode_image_bucket(
    image: Image, index: int, base: Image | None, delta: bool = True
) -> tuple[list[Any], int]:
    """The frames of bucket `index` of `image`, each tensor encoded against `base` (the version
    the receiver holds) when that is smaller, else a full copy. Returns the frames and the
    payload bytes."""
    specs = image.manifest.bucket_specs(index)
    use_base = base if base is not None and delta and base.compatible(image.manifest) else None
    tensors, payload = [], 0
    for spec in specs:
        old = use_base.arrays[spec.name] if use_base is not None else None
        enc = deltas.encode(image.arrays[spec.name], old, delta=use_base is not None)
        tensors.append((spec.name, enc.kind, enc.parts))
        payload += enc.nbytes
    base_version = use_base.version if use_base is not None else FULL_COPY
    whole = image.bucket_bytes(index) if all(t[1] == deltas.FULL for t in tensors) else None
    return encode_bucket(image.version, base_version, index, tensors, whole), payload


@dataclass
class Staging:
    """A version being received: its buckets decoded into new arrays (never into the base,
    which the engine may be sampling with), each tensor checked against its digest."""

    manifest: Manifest
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    flats: dict[int, np.ndarray] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def apply(self, bucket: Bucket, base: Image | None) -> None:
        """Decode `bucket` into the staging copy; ApplyError (nothing staged) if it is not this
        version's bucket, is encoded against another base than `base`, or any tensor's result
        does not match its digest: a wrong base, a corrupt delta."""
        m = self.manifest
        if bucket.version != m.version or not 0 <= bucket.index < len(m.buckets):
            raise ApplyError(f"bucket {bucket.index} of version {bucket.version} is not ours")
        specs = m.bucket_specs(bucket.index)
        if [t[0] for t in bucket.tensors] != [s.name for s in specs]:
            raise ApplyError(f"bucket {bucket.index} holds other tensors than the manifest's")
        if bucket.base != FULL_COPY and (base is None or base.version != bucket.base):
            held = None if base is None else base.version
            raise ApplyError(f"bucket {bucket.index} is a delta from version {bucket.base}, "
                             f"this receiver holds {held}")  # fmt: skip
        decoded, whole = {}, None
        if all(kind == deltas.FULL for _, kind, _ in bucket.tensors):
            # full copies: one copy of the payload, each tensor a view of it (not a copy each)
            whole = np.frombuffer(bucket.payload, np.uint8).copy()
            at, tensors = 0, []
            for name, kind, (part,) in bucket.tensors:
                tensors.append((name, kind, (whole[at : at + part.nbytes],)))
                at += part.nbytes
        else:
            tensors = bucket.tensors
        for spec, (_, kind, parts) in zip(specs, tensors, strict=True):
            old = base.arrays.get(spec.name) if base is not None and kind != deltas.FULL else None
            try:
                new = deltas.decode(kind, parts, old, spec.bits, spec.size, owned=whole is not None)
            except deltas.DeltaError as e:
                raise ApplyError(f"tensor {spec.name}: {e}") from None
            if deltas.tensor_digest(new) != spec.digest:
                raise ApplyError(f"tensor {spec.name} does not match its checksum after "
                                 f"decoding its {kind} encoding")  # fmt: skip
            decoded[spec.name] = new
        self.arrays.update(decoded)
        if whole is not None:
            self.flats[bucket.index] = whole
        self.done.add(bucket.index)

    def missing(self) -> list[int]:
        return [i for i in range(len(self.manifest.buckets)) if i not in self.done]

    def finish(self) -> Image:
        """The complete version (every tensor was checked as its bucket came, and the manifest's
        digest is the checksum of their digests); ApplyError while a bucket is missing."""
        if self.missing():
            raise ApplyError(f"buckets {self.missing()[:5]} of version "
                             f"{self.manifest.version} never arrived")  # fmt: skip
        return Image(self.manifest, dict(self.arrays), dict(self.flats))


def save_image(image: Image, path: Path) -> None:
    """`image` as one safetensors file, its manifest in the metadata: read back by load_image
    as the same version, identity included (the caller makes it durable)."""
    manifest = json.dumps(image.manifest.to_body())
    save_file(image.arrays, str(path), metadata={"manifest": manifest})


def load_image(path: Path, max_bytes: int) -> Image:
    """The image save_image wrote; ValueError when the file is not one, or a tensor does not
    match its manifest's checksum."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            body = json.loads((f.metadata() or {}).get("manifest", "null"))
            manifest = Manifest.from_body(body, max_bytes)
            arrays = {spec.name: f.get_tensor(spec.name) for spec in manifest.specs}
    except Exception as e:  # noqa: BLE001 - any unreadable file: safetensors' errors too
        raise ValueError(f"{path}: not a saved version ({e})") from None
    for spec in manifest.specs:
        bits = arrays[spec.name]
        if bits.dtype != spec.bits or deltas.tensor_digest(bits) != spec.digest:
            raise ValueError(f"{path}: tensor {spec.name} does not match its checksum")
    return Image(manifest, arrays)
