"""Exactly-once delivery: each new batch is spooled before it is sent, the spool is kept in step
with the trainer's acknowledgements, and what the trainer has not got is sent again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from grpo.core.episode import EpisodeBatch
from grpo.delivery.ledger import overtaken
from grpo.delivery.spool import Spool
from grpo.runtime.progress import ACTIVITY, WAITING
from grpo.wire.codec import encode_batch
from grpo.wire.sampler_channel import SamplerChannel

log = logging.getLogger("grpo.sampler")


class Outbox:
    """The sampler's batches on their way to the trainer: in the spool until acknowledged."""

    def __init__(self, spool: Spool, channel: SamplerChannel, heartbeat_s: float):
        self.spool = spool
        self.channel = channel
        self.heartbeat_s = heartbeat_s
        self.restarts_handled = 0
        self.resent_at: dict[int, float] = {}  # seq -> when last resent

    def send_new(self, batch: EpisodeBatch, state: dict[str, Any]) -> None:
        """Spool, then record the position (`state`), then send: a crash anywhere loses
        nothing."""
        frames = encode_batch(batch)
        self.channel.check_size(frames, batch.seq)
        self.spool.put(batch.seq, frames)
        self.spool.write_state(state)
        self.channel.send_frames(frames, batch.seq)

    def resend(self, seqs: list[int]) -> None:
        for seq in seqs:
            self.channel.send_frames(self.spool.frames(seq), seq)
            self.resent_at[seq] = time.monotonic()
        if seqs:
            log.info("resent %d unacknowledged batches: %s", len(seqs), seqs)

    def sync_with_trainer(self) -> None:
        """Drop acknowledged batches from the spool; resend the rest after a trainer restart,
        and any batch the trainer passed over (lost on the way)."""
        status = self.channel.status
        self.spool.acknowledge(status.acked)
        if status.restarts != self.restarts_handled:
            self.restarts_handled = status.restarts
            self.resend(self.spool.pending())
            return
        # A resend needs a few heartbeats to show up as consumed: do not repeat it before.
        patience = 10 * self.heartbeat_s
        now = time.monotonic()
        lost = [s for s in overtaken(self.spool.pending(), status.consumed)
                if now - self.resent_at.get(s, 0.0) > patience]  # fmt: skip
        if lost:
            log.warning("the trainer passed over batches %s (lost on the way): resending", lost)
            self.resend(lost)

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Sleep until `ready()` or the trainer stops us, keeping the spool in step meanwhile."""
        last_note = time.monotonic()
        ACTIVITY.enter(WAITING, f"for {what}")
        while True:
            self.sync_with_trainer()
            if ready() or self.channel.stopped.is_set():
                return
            self.channel.wait_for_news(timeout_s=5.0)
            if time.monotonic() - last_note > 60:
                version = self.channel.status.version
                log.info("waiting for %s (trainer at version %d)", what, version)
                last_note = time.monotonic()

    def wait_for_room(self) -> None:
        """Wait while the spool is full (the trainer is behind on its acknowledgements)."""
        self.wait_until(lambda: not self.spool.full(), "acknowledgements (spool full)")
