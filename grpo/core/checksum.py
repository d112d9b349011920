"""One checksum for everything we move or store: XXH3-64 (fast, strong against corruption; not
a defence against a forger, which is what CURVE is for)."""

from __future__ import annotations

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
