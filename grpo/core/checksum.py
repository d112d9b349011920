"""The sums for what we move or store. `checksum`, XXH3-64, catches corruption at memory speed
(frames, files, spools) and nothing else: anyone can make an input with a chosen XXH3 (a 1 KiB
block's accumulators are plain sums; tests/xxh3_forgery.py). `digest`, SHA-256, is what trust
rests on: every byte a sampler loads is matched against it (a version's bucket sums)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import xxhash


def checksum(buffers: Iterable[Any]) -> int:
    """Of the buffers back to back (bytes, memoryviews, numpy arrays)."""
    h = xxhash.xxh3_64()
    for b in buffers:
        h.update(b)
    return h.intdigest()


def file_digest(path: Path) -> dict[str, int]:
    """Size and checksum of a file, read in 16 MiB chunks."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return {"bytes": path.stat().st_size, "xxh3_64": h.intdigest()}


def is_hex(value: Any, chars: int) -> bool:
    """Whether `value` is exactly `chars` lowercase hex digits, as hexdigest() and
    secrets.token_hex write them (a digest or a secret a peer sends back)."""
    return (isinstance(value, str) and len(value) == chars
            and all(c in "0123456789abcdef" for c in value))  # fmt: skip


def digest(buffers: Iterable[Any]) -> str:
    """SHA-256 (hex) of the buffers back to back: collision resistant, and with the CPU's SHA
    extensions about 1-2 GB/s a core (hashlib lets go of the GIL while it hashes)."""
    h = hashlib.sha256()
    for b in buffers:
        h.update(b)
    return h.hexdigest()
