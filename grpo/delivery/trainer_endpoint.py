"""The trainer's side of delivery: which batch to train next, and what the samplers are told.

Below it, the channel (grpo.wire.trainer_channel) moves frames and keeps the sockets; above it,
the trainer asks for the next batch and reports what it did: trained on it, saved the state
that holds it, published a version. The endpoint owns the protocol state in between: the
ledger of what was trained and saved, the batches held until their predecessors arrive
(grpo.delivery.ordering), the admission check (grpo.delivery.admission), and the status that
every heartbeat carries, which it alone builds.

Rank 0 holds a `TrainerEndpoint`; every other rank a `SilentEndpoint`, which does nothing, so
the training loop calls the same methods on every rank and checks no rank itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.delivery.admission import Expected, misfit
from grpo.delivery.ledger import Ledger
from grpo.delivery.ordering import InOrder
from grpo.wire import messages
from grpo.wire.trainer_channel import TrainerChannel

log = logging.getLogger("grpo.trainer")

KEEPALIVE_S = 60.0  # how often next_batch calls its keepalive while no batch comes


class Endpoint(Protocol):
    """What the training loop asks of delivery, the same on every rank."""

    def next_batch(self, keepalive: Callable[[], None]) -> EpisodeBatch | None: ...
    def consumed(self) -> None: ...
    def saved(self) -> None: ...
    def published(self, version: int) -> None: ...
    def finish(self) -> None: ...
    def stop(self, reason: str) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def close(self) -> None: ...


class TrainerEndpoint:
    """Rank 0's delivery: receives, de-duplicates, admits and orders batches; announces."""

    def __init__(
        self,
        transport: TransportConfig,
        ledger: Ledger,
        expected: Expected,
        version: int,
        max_held: int,
        run_dir: Path | None = None,
        exit_on_stall: bool = False,
    ):
        """`ledger`, `version`: a resumed trainer's, announced from the first heartbeat on.
        `max_held`: batches held per sampler before the earliest is trained anyway."""
        self.ledger = ledger
        self.expected = expected
        self.version = version
        self.order = InOrder(ledger, max_held, transport.peer_timeout_s)
        self.duplicates_dropped = 0
        self.rejected_batches = 0
        self._status = self._current_status()
        self._weights_served = bool(transport.weights_addr)
        # Last: the channel's heartbeat thread starts reading the status at once.
        self.channel = TrainerChannel(transport, run_dir, lambda: self._status, exit_on_stall)

    def _current_status(self) -> dict[str, Any]:
        """What every heartbeat tells the samplers (rebuilt whole on each change: the
        heartbeat thread reads it without a lock)."""
        return {
            "version": self.version,
            "acks": self.ledger.acks(),
            "consumed": self.order.received_json(),
            "trained": self.ledger.trained_counts(),
        }

    def _refresh(self) -> None:
        self._status = self._current_status()

    def next_batch(self, keepalive: Callable[[], None]) -> EpisodeBatch:
        """The next batch to train: each sampler's in seq order, never one already trained or
        held, never one this trainer cannot train on (its sampler is told why). Calls
        `keepalive` every KEEPALIVE_S while none comes; raises PeerError when no sampler is
        left."""
        while (batch := self.order.pop_ready()) is None:
            batch = self.channel.recv_batch(wait_s=KEEPALIVE_S)
            if batch is None:
                keepalive()
            elif self._already_have(batch):
                self.duplicates_dropped += 1  # a resend of a batch already trained on
                log.info("dropped batch %d from %s: already trained on or held",
                         batch.seq, batch.sampler_id)  # fmt: skip
            elif (why := misfit(batch, self.expected)) is not None:
                self._reject(batch, why)
            else:
                self.order.hold(batch)  # and taken at once when it is the next one
                self._refresh()
        return batch

    def _already_have(self, batch: EpisodeBatch) -> bool:
        """Trained on, or held until its predecessors are: a resend after a restart."""
        sid, seq = batch.sampler_id, batch.seq
        return self.ledger.is_duplicate(sid, seq) or self.order.is_held(sid, seq)

    def _reject(self, batch: EpisodeBatch, why: str) -> None:
        """Drop a batch this trainer cannot train on, and tell its sampler, which stops with
        the reason: the run goes on for any other sampler, and a peer cannot end it this way."""
        self.rejected_batches += 1
        log.warning("dropped batch %d from %s (%d so far): %s", batch.seq, batch.sampler_id,
                    self.rejected_batches, why)  # fmt: skip
        self.channel.announce(
            messages.REJECTED, sampler_id=batch.sampler_id, seq=batch.seq, reason=why
        )

    def consumed(self) -> None:
        """The ledger took a trained batch: the samplers learn it from the next heartbeat."""
        self._refresh()

    def saved(self) -> None:
        """The ledger's consumed batches are now durable: acknowledge them."""
        self._refresh()

    def published(self, version: int) -> None:
        self.version = version
        self._refresh()
        self.channel.announce(messages.VERSION)

    def finish(self) -> None:
        """The run is done: tell the samplers; serve weights until each has said bye."""
        self.channel.announce(messages.DONE)
        if self._weights_served:
            self.channel.wait_for_byes()

    def stop(self, reason: str) -> None:
        self.channel.announce(messages.STOP, reason=reason)

    def counters(self) -> dict[str, int]:
        return {
            "duplicates_dropped": self.duplicates_dropped,
            "rejected_frames": self.channel.rejected_frames,
            "refused_messages": self.channel.refused_messages,
            "rejected_batches": self.rejected_batches,
        }

    def close(self) -> None:
        self.channel.close()


class SilentEndpoint:
    """Every rank but 0: it receives batches by broadcast from rank 0 and talks to nobody."""

    def next_batch(self, keepalive: Callable[[], None]) -> None:
        return None

    def consumed(self) -> None:
        pass

    def saved(self) -> None:
        pass

    def published(self, version: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def stop(self, reason: str) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass
