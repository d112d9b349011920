"""Per-tensor weight deltas: version v' sent to a sampler that holds version v as whatever is
smallest of the whole tensor, the elements that changed, or their compressed XOR.

Pure functions over the tensors' bit patterns: a tensor of any dtype travels as a flat,
C-contiguous numpy array of the signed int dtype of its itemsize (bfloat16 as int16 bits,
float32 as int32 bits); its dtype name is metadata carried elsewhere. No torch here: relay
processes without torch use this module too.

The three encodings and their parts (each part one raw frame):

- ``FULL``: ``(new,)``, the array itself, not copied.
- ``SPARSE``: ``(indices, values)``: the strictly increasing positions where the bit patterns
  differ (uint32, or uint64 for tensors of 2**32 elements or more) and the new bit patterns
  there. No change at all is a SPARSE of two empty parts: 0 bytes.
- ``XOR_ZSTD``: ``(frame,)``: one zstd frame, its content size in its header, of the XOR of
  the bit patterns, byte-shuffled (byte 0 of every element, then byte 1, ...) as blosc does:
  a training step changes the low mantissa bits and rarely the sign and exponent, so the
  high byte planes are almost all zeros and compress to nearly nothing.

Decoding trusts nothing it is given: any part that does not fit is a :class:`DeltaError`, and
the zstd frame is decompressed only when its header declares exactly the expected size, so
a small frame cannot make the receiver allocate more than the tensor's bytes. A delta
applied to the wrong base decodes to the wrong tensor: the caller's check of the result
against the sender's checksum (grpo.weights.stream.frames.bucket_sum) is what catches that.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

__all__ = [
    "ENCODINGS",
    "FULL",
    "SPARSE",
    "XOR_ZSTD",
    "DeltaError",
    "Encoded",
    "decode",
    "encode",
    "index_dtype",
]

FULL = "full"
SPARSE = "sparse"
XOR_ZSTD = "xor_zstd"
ENCODINGS = (FULL, SPARSE, XOR_ZSTD)

# Level 1: on the XOR of real AdamW steps of SmolLM2-135M (bench/weight_delta.py,
# DELTA_NOTES.md) levels 1, 2 and 3 give the same size within 0.5% (bf16 0.0536 / 0.0540 /
# 0.0537 of the full bytes, fp32 0.458 for all three) while 3 compresses at 0.6-0.8 GB/s
# against 1.0 GB/s for 1; negative levels are faster only on fp32 and cost 15-20% in size.
ZSTD_LEVEL = 1
# A tensor of more elements than this is first probed: PROBE_BLOCKS blocks of PROBE_ELEMENTS
# spread over it are compressed, and the whole is compressed only when the probe's ratio
# says it may beat FULL or SPARSE (an incompressible XOR, e.g. a re-initialised tensor,
# then costs ~1% of a compression instead of all of it).
PROBE_BLOCKS = 16
PROBE_ELEMENTS = 4096
PROBE_ABOVE = 4 * PROBE_BLOCKS * PROBE_ELEMENTS
_PREFERENCE = {FULL: 0, SPARSE: 1, XOR_ZSTD: 2}  # on equal sizes: the cheaper decode


class DeltaError(ValueError):
    """A delta that cannot be applied: wrong base, malformed parts."""


def _part_bytes(part: Any) -> int:
    return memoryview(part).nbytes


@dataclass(frozen=True)
class Encoded:
    kind: str  # one of ENCODINGS
    parts: tuple[Any, ...]  # raw frames: numpy arrays or bytes

    @property
    def nbytes(self) -> int:
        """What goes on the wire: the parts' bytes."""
        return sum(_part_bytes(p) for p in self.parts)


def index_dtype(size: int) -> np.dtype:
    """SPARSE's index type for a tensor of `size` elements."""
    return np.dtype(np.uint32 if size < 2**32 else np.uint64)


def _shuffle(bits: np.ndarray) -> np.ndarray:
    """Byte planes: all bytes 0 of the elements, then all bytes 1, ... (one plane per byte of
    the itemsize, as a (itemsize, size) uint8 array). Plane by plane: numpy's copy of the
    whole transposed view is 4x slower to invert."""
    width = bits.itemsize
    as_bytes = bits.view(np.uint8).reshape(bits.size, width)
    planes = np.empty((width, bits.size), np.uint8)
    for b in range(width):
        planes[b] = as_bytes[:, b]
    return planes


def _unshuffle(planes: np.ndarray, dtype: np.dtype, size: int) -> np.ndarray:
    """The inverse of _shuffle, into a new writable array of `dtype`."""
    width = dtype.itemsize
    as_bytes = np.empty((size, width), np.uint8)
    for b in range(width):
        as_bytes[:, b] = planes[b * size : (b + 1) * size]
    return as_bytes.reshape(-1).view(dtype)


def _compress(xor: np.ndarray) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(
        _shuffle(xor)
    )


def _probe_ratio(xor: np.ndarray) -> float:
    """Compressed / raw bytes of PROBE_BLOCKS evenly spaced blocks of the XOR."""
    starts = np.linspace(0, xor.size - PROBE_ELEMENTS, PROBE_BLOCKS).astype(np.int64)
    sample = np.concatenate([xor[s : s + PROBE_ELEMENTS] for s in starts])
    return len(_compress(sample)) / sample.nbytes


def _check_bits(array: Any, what: str) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{what}: a numpy array of bit patterns, not {type(array).__name__}")
    if array.dtype.kind != "i" or array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError(
            f"{what}: a flat C-contiguous signed int array, not {array.dtype} "
            f"of shape {array.shape}"
        )


def encode(new: np.ndarray, base: np.ndarray | None, *, delta: bool = True) -> Encoded:
    """The smallest encoding of `new` for a receiver holding `base`; FULL without a usable
    base (none, `delta` off, another dtype or shape). Never larger than FULL."""
    _check_bits(new, "new")
    full = Encoded(FULL, (new,))
    if not delta or base is None or new.size == 0:
        return full
    _check_bits(base, "base")
    if base.dtype != new.dtype or base.shape != new.shape:
        return full
    xor = np.bitwise_xor(new, base)
    changed = int(np.count_nonzero(xor))
    if changed == 0:
        return Encoded(SPARSE, (np.empty(0, index_dtype(new.size)), new[:0]))
    sizes = {FULL: new.nbytes, SPARSE: changed * (index_dtype(new.size).itemsize + new.itemsize)}
    best_other = min(sizes.values())
    frame = None
    if new.size <= PROBE_ABOVE or _probe_ratio(xor) * new.nbytes < best_other:
        frame = _compress(xor)
        sizes[XOR_ZSTD] = len(frame)
    kind = min(sizes, key=lambda k: (sizes[k], _PREFERENCE[k]))
    if kind == XOR_ZSTD:
        return Encoded(XOR_ZSTD, (frame,))
    if kind == SPARSE:
        indices = np.flatnonzero(xor).astype(index_dtype(new.size))
        return Encoded(SPARSE, (indices, new[indices]))
    return full


def _target(dtype: Any, size: Any) -> tuple[np.dtype, int]:
    try:
        dtype, size = np.dtype(dtype), operator.index(size)
    except TypeError as e:
        raise DeltaError(f"bad dtype or size: {e}") from None
    if dtype.kind != "i" or not dtype.isnative or dtype.itemsize not in (1, 2, 4, 8):
        raise DeltaError(f"dtype {dtype} is not a native signed int dtype of bit patterns")
    if size < 0:
        raise DeltaError(f"negative size {size}")
    return dtype, size


def _checked_base(base: Any, dtype: np.dtype, size: int, kind: str) -> np.ndarray:
    if base is None:
        raise DeltaError(f"{kind} needs a base and there is none")
    if not isinstance(base, np.ndarray) or base.dtype != dtype or base.size != size:
        got = f"{base.dtype} x {base.size}" if isinstance(base, np.ndarray) else type(base).__name__
        raise DeltaError(f"{kind} base is {got}, not {dtype} x {size}")
    return base.reshape(-1)


def _array(part: Any, dtype: np.dtype, count: int, what: str) -> np.ndarray:
    """A read-only view of a part that must hold exactly `count` elements of `dtype`."""
    nbytes = _part_bytes(part)
    if nbytes != count * dtype.itemsize:
        raise DeltaError(f"{what} part has {nbytes} bytes, not {count * dtype.itemsize}")
    return np.frombuffer(part, dtype, count)


def _decode_sparse(
    parts: Sequence[Any], base: np.ndarray, dtype: np.dtype, size: int
) -> np.ndarray:
    idx_dtype = index_dtype(size)
    index_bytes = _part_bytes(parts[0])
    if index_bytes % idx_dtype.itemsize:
        raise DeltaError(f"sparse index part of {index_bytes} bytes is not whole {idx_dtype}s")
    count = index_bytes // idx_dtype.itemsize
    indices = _array(parts[0], idx_dtype, count, "sparse index")
    values = _array(parts[1], dtype, count, "sparse value")
    if count and indices[-1] >= size:
        raise DeltaError(f"sparse index {int(indices[-1])} out of range for {size} elements")
    if count > 1 and not np.all(indices[1:] > indices[:-1]):
        raise DeltaError("sparse indices are not strictly increasing")
    out = base.copy()
    out[indices] = values
    return out


def _decode_xor(part: Any, base: np.ndarray, dtype: np.dtype, size: int) -> np.ndarray:
    expected = size * dtype.itemsize
    if expected == 0:  # the encoder sends an empty tensor FULL: an empty frame goes unchecked
        raise DeltaError("xor_zstd of an empty tensor")
    try:
        declared = zstandard.frame_content_size(part)
        if declared != expected:  # checked first: decompress allocates what the header says
            raise DeltaError(f"zstd frame declares {declared} bytes, not {expected}")
        raw = zstandard.ZstdDecompressor().decompress(part, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise DeltaError(f"zstd frame does not decompress: {e}") from None
    if len(raw) != expected:  # decompress checks it; kept so that no version can skip it
        raise DeltaError(f"zstd frame gave {len(raw)} bytes, not {expected}")
    out = _unshuffle(np.frombuffer(raw, np.uint8), dtype, size)
    np.bitwise_xor(out, base, out=out)
    return out


_PART_COUNTS = {FULL: 1, SPARSE: 2, XOR_ZSTD: 1}


def decode(
    kind: str, parts: Sequence[Any], base: np.ndarray | None, dtype: np.dtype, size: int
) -> np.ndarray:
    """The new tensor's bit patterns, a new writable flat array of `dtype` and `size`
    elements; `base` is never modified. Every failure is a DeltaError."""
    if kind not in ENCODINGS:
        raise DeltaError(f"unknown encoding {kind!r}, not one of {ENCODINGS}")
    dtype, size = _target(dtype, size)
    try:
        if len(parts) != _PART_COUNTS[kind]:
            raise DeltaError(f"{kind} has {_PART_COUNTS[kind]} parts, not {len(parts)}")
        if kind == FULL:
            return _array(parts[0], dtype, size, "full").copy()
        flat = _checked_base(base, dtype, size, kind)
        if kind == SPARSE:
            return _decode_sparse(parts, flat, dtype, size)
        return _decode_xor(parts[0], flat, dtype, size)
    except DeltaError:
        raise
    except (TypeError, ValueError, BufferError, OverflowError) as e:
        raise DeltaError(f"malformed {kind} parts: {type(e).__name__}: {e}") from None
