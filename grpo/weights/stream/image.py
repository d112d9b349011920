"""A weights version in host memory (an `Image`), its buckets encoded against a base, and the
staging copy a receiver fills bucket by bucket and turns into an Image only when every bucket
has come and matched its checksum: all or nothing.

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
from grpo.weights.stream.frames import (
    FULL_COPY,
    Bucket,
    Manifest,
    TensorSpec,
    bucket_sum,
    bucket_sums,
    encode_delta_bucket,
    encode_full_bucket,
    plan_buckets,
)


class ApplyError(ValueError):
    """A bucket that cannot go into the staging copy (it is left as it was)."""


class Image:
    """A version's tensors as flat arrays of their bit patterns (`arrays`: name -> array), and
    (`flats`: bucket index -> buffer) each bucket held as one buffer, built or received so: sent
    as a full-copy bucket's payload as it is, loaded with one split. The arrays of a bucket
    held as one buffer are views of it, made when first asked for (a delta to encode or
    decode, a file to write): a sync of full copies never needs them."""

    def __init__(
        self,
        manifest: Manifest,
        arrays: dict[str, np.ndarray] | None = None,
        flats: dict[int, np.ndarray] | None = None,
    ):
        self.manifest = manifest
        self.flats = dict(flats or {})
        self._arrays = dict(arrays or {})
        self._split = not self.flats

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        if not self._split:  # idempotent: two threads asking at once make the same views
            for index, flat in self.flats.items():
                specs = self.manifest.bucket_specs(index)
                if specs[0].name not in self._arrays:
                    self._arrays.update(split_bucket(flat, specs))
            self._split = True
        return self._arrays

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
    ) -> Image:
        """From (name, dtype name, shape, flat bit array) in the order they will travel."""
        specs, arrays = [], {}
        for name, dtype, shape, bits in tensors:
            specs.append(TensorSpec(name, dtype, tuple(shape)))
            arrays[name] = bits
        buckets = plan_buckets([s.nbytes for s in specs], bucket_bytes)
        sums = bucket_sums([[arrays[s.name] for s in specs[a:b]] for a, b in buckets])
        return cls(Manifest(version, tuple(specs), buckets, adapter, sums), arrays)

    @classmethod
    def of_buckets(
        cls,
        version: int,
        specs: tuple[TensorSpec, ...],
        buckets: tuple[tuple[int, int], ...],
        flats: dict[int, np.ndarray],
        adapter: bool,
    ) -> Image:
        """From each bucket's buffer (uint8, its tensors back to back)."""
        sums = bucket_sums([[flats[i]] for i in range(len(buckets))])
        return cls(Manifest(version, specs, buckets, adapter, sums), flats=flats)

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
        return self.manifest.specs == manifest.specs


def split_bucket(flat: np.ndarray, specs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """A bucket's buffer (uint8) as its tensors' flat bit patterns: views of it, or a copy of
    a tensor that would sit unaligned (after an odd-sized one of a narrower dtype)."""
    arrays, at = {}, 0
    for spec in specs:
        bits = flat[at : at + spec.nbytes].view(spec.bits)
        arrays[spec.name] = bits if bits.flags.aligned else bits.copy()
        at += spec.nbytes
    return arrays


def encode_image_bucket(
    image: Image, index: int, base: Image | None, delta: bool = True
) -> tuple[list[Any], int]:
    """The frames of bucket `index` of `image`: each tensor encoded against `base` (the version
    the receiver holds) when that is smaller, else (no usable base, or no tensor smaller as a
    delta) the bucket as full copies. Returns the frames and the payload bytes."""
    use_base = base if base is not None and delta and base.compatible(image.manifest) else None
    if use_base is not None:
        tensors, payload = [], 0
        for spec in image.manifest.bucket_specs(index):
            enc = deltas.encode(image.arrays[spec.name], use_base.arrays[spec.name])
            tensors.append((spec.name, enc.kind, enc.parts))
            payload += enc.nbytes
        if any(kind != deltas.FULL for _, kind, _ in tensors):
            return encode_delta_bucket(image.version, use_base.version, index, tensors), payload
    whole = image.bucket_bytes(index)
    return encode_full_bucket(image.version, index, whole), whole.nbytes


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
        version's bucket, is encoded against another base than `base`, or its tensors do not
        match the bucket's checksum: a wrong base, a corrupt delta."""
        m, index = self.manifest, bucket.index
        if bucket.version != m.version or not 0 <= index < len(m.buckets):
            raise ApplyError(f"bucket {index} of version {bucket.version} is not ours")
        specs = m.bucket_specs(index)
        if bucket.base == FULL_COPY:
            size = m.bucket_nbytes[index]
            if bucket.payload.nbytes != size:
                raise ApplyError(
                    f"bucket {index} holds {bucket.payload.nbytes} bytes, its tensors {size}"
                )
            # the tensors view the payload: the socket's buffer, the receiver's own once
            # received (a read-only one, a relay's or a test's bytes, is copied)
            whole = np.frombuffer(bucket.payload, np.uint8)
            if bucket_sum([whole]) != m.sums[index]:
                raise ApplyError(f"bucket {index} does not match its checksum")
            self.flats[index] = whole if whole.flags.writeable else whole.copy()
            self.done.add(index)
            return
        if [t[0] for t in bucket.tensors] != [s.name for s in specs]:
            raise ApplyError(f"bucket {index} holds other tensors than the manifest's")
        if base is None or base.version != bucket.base:
            held = None if base is None else base.version
            raise ApplyError(
                f"bucket {index} is a delta from version {bucket.base}, this receiver holds {held}"
            )
        decoded = {}
        for spec, (_, kind, parts) in zip(specs, bucket.tensors, strict=True):
            old = base.arrays.get(spec.name) if kind != deltas.FULL else None
            try:
                decoded[spec.name] = deltas.decode(kind, parts, old, spec.bits, spec.size)
            except deltas.DeltaError as e:
                raise ApplyError(f"tensor {spec.name}: {e}") from None
        if bucket_sum(list(decoded.values())) != m.sums[index]:
            raise ApplyError(
                f"bucket {index} does not match its checksum after decoding its deltas"
            )
        self.arrays.update(decoded)
        self.done.add(index)

    def missing(self) -> list[int]:
        return [i for i in range(len(self.manifest.buckets)) if i not in self.done]

    def finish(self) -> Image:
        """The complete version (every bucket was checked as it came); ApplyError while a
        bucket is missing."""
        if self.missing():
            raise ApplyError(
                f"buckets {self.missing()[:5]} of version {self.manifest.version} never arrived"
            )
        return Image(self.manifest, self.arrays, self.flats)


def save_image(image: Image, path: Path) -> None:
    """`image` as one safetensors file, its manifest in the metadata: read back by load_image
    as the same version, identity included (the caller makes it durable)."""
    manifest = json.dumps(image.manifest.to_body())
    save_file(image.arrays, str(path), metadata={"manifest": manifest})


def load_image(path: Path, max_bytes: int) -> Image:
    """The image save_image wrote; ValueError when the file is not one, or a bucket does not
    match its manifest's checksum."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            body = json.loads((f.metadata() or {}).get("manifest", "null"))
            manifest = Manifest.from_body(body, max_bytes)
            arrays = {spec.name: f.get_tensor(spec.name) for spec in manifest.specs}
    except Exception as e:  # noqa: BLE001 - any unreadable file: safetensors' errors too
        raise ValueError(f"{path}: not a saved version ({e})") from None
    for spec in manifest.specs:
        if arrays[spec.name].dtype != spec.bits or arrays[spec.name].size != spec.size:
            raise ValueError(f"{path}: tensor {spec.name} is not what its manifest says")
    for index, expected in enumerate(manifest.sums):
        if bucket_sum([arrays[s.name] for s in manifest.bucket_specs(index)]) != expected:
            raise ValueError(f"{path}: bucket {index} does not match its checksum")
    return Image(manifest, arrays)
