"""The frames of a streamed weights version (weights.mode: stream): its manifest and its buckets.

A version is an ordered list of tensors, each named with its dtype and shape (`TensorSpec`); the
manifest cuts the list into buckets of about weights.bucket_mb and carries each bucket's
digest: BLAKE3 of its tensors' bit patterns back to back, so that a bucket is checked with
one call whatever its tensors (a LoRA adapter is 240 small ones; a checksum each was a tenth of
its sync). The digest, not a fast checksum: an XXH3-equal bucket is a few lines of arithmetic
away (tests/xxh3_forgery.py), and the sampler loads whatever matches. A bucket travels as one
message of two frames:

    frame 0   a checksum (below), then a msgpack header: {"version", "base", "index",
              "tensors"}
    frame 1   the payload

A bucket of full copies (base -1) lists no tensors: its payload is its tensors' bit patterns
back to back in the manifest's order, as the trainer's version image holds them. A delta bucket
(base: the version it is encoded against) lists [name, encoding, [part bytes, ...]] for each
tensor, and its payload is every tensor's encoded parts (grpo.weights.stream.deltas), raw, back
to back in the header's order. One payload frame, not a frame per part: ZeroMQ pays about 30 us
a frame on each side.

Frame 0's checksum is XXH3-64 of the header, and of a delta bucket's payload after it: it
catches a corrupted transfer before a delta is decoded (corruption only: the bucket digests are
what a forger cannot match). A full copy's payload is covered by the manifest's digest of its
bucket alone, checked once where it is staged: the same bytes summed
twice on each side cost a LoRA sync a tenth of its budget. The bucket checksums also catch what
a checksum of the frames cannot: a delta applied to the wrong base. Decoding checks every field
and raises only FrameError, like the episode codec.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack
import numpy as np

from grpo.core.checksum import checksum, digest, is_hex
from grpo.weights.stream.deltas import ENCODINGS
from grpo.wire.codec import FrameError, as_bytes, require, seal
from grpo.wire.unpack import unpack_bounded

# The bit pattern each dtype travels as: a signed integer of its width, so that deltas XOR and
# compare bits, never values (a NaN or a -0.0 round-trips exactly).
BITS = {
    "float64": np.dtype("<i8"),
    "float32": np.dtype("<i4"),
    "bfloat16": np.dtype("<i2"),
    "float16": np.dtype("<i2"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("<i1"),
    "uint8": np.dtype("<i1"),
    "bool": np.dtype("<i1"),
}
FULL_COPY = -1  # the base of a bucket of full copies
MAX_TENSORS = 1 << 20
MAX_PARTS = 2  # per tensor: grpo.weights.stream.deltas' encodings have one or two
_SUM = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # a key of BITS
    shape: tuple[int, ...]

    @property
    def bits(self) -> np.dtype:
        return BITS[self.dtype]

    @cached_property  # read for every tensor of every bucket, sent or received
    def size(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def nbytes(self) -> int:
        return self.size * self.bits.itemsize


@dataclass(frozen=True)
class Manifest:
    """What a version holds, and how it is cut into buckets (index ranges into `specs`)."""

    version: int
    specs: tuple[TensorSpec, ...]
    buckets: tuple[tuple[int, int], ...]
    adapter: bool  # a LoRA adapter's tensors, not the whole model's
    sums: tuple[str, ...]  # each bucket's BLAKE3, hex (bucket_sum)

    @cached_property
    def spec_list(self) -> list[list[Any]]:
        """The specs as the wire carries them."""
        return [[s.name, s.dtype, list(s.shape)] for s in self.specs]

    @cached_property
    def identity(self) -> str:
        """SHA-256 (hex) of everything the manifest says: version, adapter, every tensor's
        name, dtype and shape, the bucket tiling and each bucket's digest. The trainer
        announces it with each version over the channel the samplers authenticate; a sampler
        takes a manifest from any source (a relay included) only when it has this identity,
        and then each bucket only when it matches the manifest's digest."""
        body = [self.version, self.adapter, self.spec_list, self._bucket_list()]
        return hashlib.sha256(msgpack.packb(body)).hexdigest()

    def _bucket_list(self) -> list[list[int]]:
        return [[*b, s] for b, s in zip(self.buckets, self.sums, strict=True)]

    @cached_property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    @cached_property
    def bucket_nbytes(self) -> tuple[int, ...]:
        """Each bucket's tensors' bytes."""
        return tuple(sum(s.nbytes for s in self.specs[a:b]) for a, b in self.buckets)

    def cut_like(self, other: Manifest) -> bool:
        """Whether this manifest lists `other`'s tensors in the same buckets (a version of the
        same model, cut the same way). Versions of one model share their specs' tuple."""
        same_specs = self.specs is other.specs or self.specs == other.specs
        return same_specs and self.buckets == other.buckets

    def bucket_specs(self, index: int) -> tuple[TensorSpec, ...]:
        start, end = self.buckets[index]
        return self.specs[start:end]

    def to_body(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "specs": self.spec_list,
            "buckets": self._bucket_list(),
            "adapter": self.adapter,
        }

    @classmethod
    def from_body(cls, body: Any, max_bytes: int, known: Manifest | None = None) -> Manifest:
        """A manifest from a peer, refused (FrameError) unless every field is well formed, the
        buckets tile the tensors in order, and its size is within `max_bytes`. `known`: a
        manifest checked before (the version the receiver holds); when this one lists the
        same tensors, its specs are taken as they are, not checked again one by one."""
        require(isinstance(body, dict), "a manifest must be a map")
        version, raw, buckets = body.get("version"), body.get("specs"), body.get("buckets")
        require(type(version) is int and version >= 0, "a manifest's version must be an int >= 0")
        if known is not None and raw == known.spec_list:
            specs = known.specs
        else:
            require(isinstance(raw, list) and len(raw) <= MAX_TENSORS, "a manifest's specs")
            specs = tuple(_spec(item) for item in raw)
            require(len({s.name for s in specs}) == len(specs), "a manifest names a tensor twice")
        require(isinstance(buckets, list) and bool(buckets) == bool(specs), "manifest buckets")
        triples = [b for b in buckets if isinstance(b, list) and len(b) == 3]
        require(len(triples) == len(buckets), "a manifest's buckets must be [start, end, sum]")
        require(all(type(x) is int for b in triples for x in b[:2]), "a manifest's bucket fields")
        ends = [0] + [end for _, end, _ in triples]
        require(
            all(start == ends[i] and end > start for i, (start, end, _) in enumerate(triples))
            and ends[-1] == len(specs),
            "a manifest's buckets do not tile its tensors",
        )
        require(all(is_hex(s, DIGEST_CHARS) for *_, s in triples), "a manifest's bucket digests")
        bounds = tuple((start, end) for start, end, _ in triples)
        sums = tuple(s for *_, s in triples)
        manifest = cls(version, specs, bounds, body.get("adapter") is True, sums)
        require(
            manifest.nbytes <= max_bytes,
            f"a version of {manifest.nbytes} bytes is over "
            f"transport.max_version_bytes ({max_bytes})",
        )
        return manifest


def _spec(item: Any) -> TensorSpec:
    ok = isinstance(item, list) and len(item) == 3
    name, dtype, shape = item if ok else (None, None, None)
    require(isinstance(name, str) and 0 < len(name) <= 1024, "a tensor's name")
    require(dtype in BITS, f"tensor {name}: unknown dtype {dtype!r:.40}")
    require(
        isinstance(shape, list)
        and len(shape) <= 8
        and all(type(d) is int and d >= 0 for d in shape),
        f"tensor {name}: a bad shape",
    )
    return TensorSpec(name, dtype, tuple(shape))


def bucket_sum(parts: Sequence[Any]) -> str:
    """A bucket's digest: BLAKE3 (hex) of its tensors' bit patterns back to back (one buffer
    holding them all sums the same as the tensors one after another)."""
    return digest(parts)


def bucket_sums(buckets: Sequence[Sequence[Any]]) -> tuple[str, ...]:
    """Each bucket's digest (`buckets`: each one's parts), on as many threads as cores: BLAKE3
    runs at several GB/s a core, and lets go of the GIL while it hashes."""
    if len(buckets) < 2:
        return tuple(bucket_sum(parts) for parts in buckets)
    with ThreadPoolExecutor(min(len(buckets), os.cpu_count() or 1)) as pool:
        return tuple(pool.map(bucket_sum, buckets))


DIGEST_CHARS = 64  # a 256-bit digest in hex


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> tuple[tuple[int, int], ...]:
    """Consecutive tensors grouped into buckets of at most `bucket_bytes` (a larger tensor is a
    bucket of its own)."""
    buckets, start, filled = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and filled + size > bucket_bytes:
            buckets.append((start, i))
            start, filled = i, 0
        filled += size
    if start < len(sizes):
        buckets.append((start, len(sizes)))
    return tuple(buckets)


@dataclass(frozen=True)
class Bucket:
    version: int
    base: int  # FULL_COPY: the payload is the tensors back to back, none listed
    index: int
    tensors: tuple[tuple[str, str, tuple[memoryview, ...]], ...]  # name, encoding, parts
    payload: memoryview  # every part, back to back (the parts are views of it)

    @property
    def nbytes(self) -> int:
        return self.payload.nbytes


def encode_full_bucket(version: int, index: int, payload: Any) -> list[Any]:
    """Frames (for send_multipart(copy=False)) of a bucket of full copies: `payload` its
    tensors' bit patterns back to back, sent as it is (the frame checksum covers the header;
    the manifest's bucket checksum, the payload)."""
    header = {"version": version, "base": FULL_COPY, "index": index, "tensors": []}
    return [*seal(msgpack.packb(header, use_bin_type=True)), payload]


def encode_delta_bucket(
    version: int, base: int, index: int, tensors: Sequence[tuple[str, str, Sequence[Any]]]
) -> list[Any]:
    """Frames of a bucket encoded against version `base`: each tensor's (name, encoding,
    parts), the parts joined into the payload."""
    lengths = [[as_bytes(p).nbytes for p in parts] for _, _, parts in tensors]
    header = {
        "version": version,
        "base": base,
        "index": index,
        "tensors": [[name, kind, n] for (name, kind, _), n in zip(tensors, lengths, strict=True)],
    }
    parts = [as_bytes(p) for _, _, ps in tensors for p in ps]
    return seal(msgpack.packb(header, use_bin_type=True), [b"".join(parts)])


def decode_bucket(frames: Sequence[Any], max_bytes: int) -> Bucket:
    """A bucket's frames checked: checksum, header, part lengths (a full copy's payload is
    checked against the manifest where it is staged). Raises only FrameError."""
    try:
        return _decode_bucket(frames, max_bytes)
    except FrameError:
        raise
    except Exception as e:  # a gap in the checks must still refuse the frames
        raise FrameError(f"undecodable bucket: {type(e).__name__}: {e}") from e


def _decode_bucket(frames: Sequence[Any], max_bytes: int) -> Bucket:
    require(len(frames) == 2, f"a bucket of {len(frames)} frames, not 2")
    views = [as_bytes(f) for f in frames]
    require(views[1].nbytes <= max_bytes, "a bucket over the size limit")
    require(views[0].nbytes > _SUM.size, "a bucket's frame 0 is too short")
    (expected,) = _SUM.unpack(views[0][: _SUM.size])
    header_view, payload = views[0][_SUM.size :], views[1]
    header = unpack_bounded(header_view)  # bounded: safe to read before it is checked
    require(isinstance(header, dict), "a bucket's header must be a map")
    version, base, index = header.get("version"), header.get("base"), header.get("index")
    covered = [header_view] if base == FULL_COPY else [header_view, payload]
    require(checksum(covered) == expected, "a bucket's checksum does not match")
    require(type(version) is int and version >= 0, "a bucket's version")
    require(type(base) is int and base >= -1, "a bucket's base")
    require(type(index) is int and index >= 0, "a bucket's index")
    entries = header.get("tensors")
    require(isinstance(entries, list) and len(entries) <= MAX_TENSORS, "a bucket's tensors")
    if base == FULL_COPY:
        require(not entries, "a bucket of full copies lists tensors")
        return Bucket(version, base, index, (), payload)
    require(bool(entries), "a delta bucket lists no tensors")
    tensors, at = [], 0
    for entry in entries:
        require(isinstance(entry, list) and len(entry) == 3, "a bucket's tensor entry")
        name, kind, lengths = entry
        require(isinstance(name, str) and kind in ENCODINGS, f"a bucket's tensor {name!r:.80}")
        require(
            isinstance(lengths, list)
            and 1 <= len(lengths) <= MAX_PARTS
            and all(type(n) is int and n >= 0 for n in lengths),
            f"tensor {name}: parts {lengths!r:.40}",
        )
        parts = []
        for n in lengths:
            parts.append(payload[at : at + n])
            at += n
        tensors.append((name, kind, tuple(parts)))
    # the parts tile the payload: none past its end (a slice would be cut short), none left over
    require(at == payload.nbytes, f"a bucket's payload of {payload.nbytes} bytes, its parts {at}")
    return Bucket(version, base, index, tuple(tensors), payload)
