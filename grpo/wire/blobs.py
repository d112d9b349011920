"""A message's frames as one byte string and back: how the spool stores a batch on disk and how
rank 0 broadcasts one to the other trainer ranks (a single uint8 tensor)."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from grpo.wire.codec import as_bytes, require

# Layout: magic, u64 frame count, u64 lengths, then the payloads, each 8-byte aligned.
_BLOB_MAGIC = b"GRPOFRM1"
_U64 = struct.Struct("<Q")
_ALIGN = 8


def _pad(n: int) -> int:
    return -n % _ALIGN


def frames_to_bytes(frames: Iterable[Any]) -> bytes:
    """Frames as one length-prefixed blob, e.g. to broadcast as a single uint8 tensor.

    Layout: magic, u64 count, u64 length per frame, then the payloads, each padded
    to 8 bytes so that the int32/float32 views made by decode stay aligned.
    """
    views = [as_bytes(f) for f in frames]
    parts: list[bytes | memoryview] = [_BLOB_MAGIC, _U64.pack(len(views))]
    parts += [_U64.pack(v.nbytes) for v in views]
    for v in views:
        parts += [v, b"\0" * _pad(v.nbytes)]
    return b"".join(parts)


def bytes_to_frames(blob: Any) -> list[memoryview]:
    """Inverse of :func:`frames_to_bytes`; the frames are views into ``blob``.

    Accepts any byte buffer (bytes, bytearray, a uint8 numpy array). Raises FrameError.
    """
    mv = as_bytes(blob)
    head = len(_BLOB_MAGIC) + _U64.size
    require(mv.nbytes >= head, f"blob of {mv.nbytes} bytes is too short")
    require(bytes(mv[: len(_BLOB_MAGIC)]) == _BLOB_MAGIC, "bad blob magic")
    (n,) = _U64.unpack_from(mv, len(_BLOB_MAGIC))
    # Bound n by what the blob can hold before reading the length table.
    require(n <= (mv.nbytes - head) // _U64.size, f"blob claims {n} frames")
    lengths = [_U64.unpack_from(mv, head + i * _U64.size)[0] for i in range(n)]
    pos = head + n * _U64.size
    require(
        pos + sum(ln + _pad(ln) for ln in lengths) == mv.nbytes,
        "blob length does not match its frame table",
    )
    out = []
    for ln in lengths:
        out.append(mv[pos : pos + ln])
        pos += ln + _pad(ln)
    return out
