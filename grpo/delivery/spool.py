"""The sampler's on-disk spool: every batch it sent and the trainer has not yet made durable.

    <spool dir>/b000000012.frames   one sent batch (its wire frames), until acknowledged
    <spool dir>/state.json          next seq, dataset position, dataset fingerprint

A batch is written (fsync, rename) before it is sent, and the state after it, so a crash at any
point leaves either the batch with its position or neither. After the trainer restarts, the
spool is resent; the trainer drops what it already has. The spool is bounded: the sampler waits
for acknowledgements instead of growing it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from grpo.core.durable import write_atomic
from grpo.core.episode import EpisodeBatch
from grpo.core.seqset import SeqSet
from grpo.wire.blobs import bytes_to_frames, frames_to_bytes
from grpo.wire.codec import FrameError, decode

STATE_FILE = "state.json"
_BATCH_FILE = re.compile(r"b(\d{9})\.frames")


class Spool:
    def __init__(self, directory: Path, max_batches: int):
        self.dir = directory
        self.max_batches = max_batches
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".*.tmp*"):  # a write that a crash interrupted
            stale.unlink()

    def _path(self, seq: int) -> Path:
        return self.dir / f"b{seq:09d}.frames"

    def pending(self) -> list[int]:
        """Sequence numbers sent and not yet acknowledged, oldest first."""
        return sorted(int(m[1]) for p in self.dir.iterdir() if (m := _BATCH_FILE.fullmatch(p.name)))

    def full(self) -> bool:
        return len(self.pending()) >= self.max_batches

    def put(self, seq: int, frames: list[Any]) -> None:
        write_atomic(self._path(seq), frames_to_bytes(frames))

    def frames(self, seq: int) -> list[memoryview]:
        return bytes_to_frames(self._path(seq).read_bytes())

    def batch(self, seq: int) -> EpisodeBatch:
        """The spooled batch, checked like any received one (a corrupt file raises FrameError)."""
        item = decode(self.frames(seq))
        if not isinstance(item, EpisodeBatch):
            raise FrameError(f"{self._path(seq)} holds a message, not a batch")
        return item

    def acknowledge(self, acked: SeqSet) -> int:
        """Forget the batches the trainer made durable; returns how many were removed."""
        done = [seq for seq in self.pending() if seq in acked]
        for seq in done:
            self._path(seq).unlink(missing_ok=True)
        return len(done)

    def read_state(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir / STATE_FILE).read_text())
        except FileNotFoundError:
            return None

    def write_state(self, state: dict[str, Any]) -> None:
        write_atomic(self.dir / STATE_FILE, json.dumps(state).encode())

    def clear(self) -> None:
        for seq in self.pending():
            self._path(seq).unlink()
        (self.dir / STATE_FILE).unlink(missing_ok=True)
