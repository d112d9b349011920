"""The trainer's side of delivery: which batch to train next, and what the samplers are told.

Below it, the channel (grpo.wire.trainer_channel) moves frames and keeps the sockets; above it,
the trainer asks for the next batch and reports what it did: trained on it, saved the state
that holds it, published a version. The endpoint owns the protocol state in between: the
ledger of what was trained and saved, the batches held until their predecessors arrive
(grpo.delivery.ordering), the admission check (grpo.delivery.admission), the pool of samplers
and which of them are alive (grpo.delivery.pool), and the status that every heartbeat
carries, which it alone builds.

Rank 0 holds a `TrainerEndpoint`; every other rank a `SilentEndpoint`, which does nothing, so
the training loop calls the same methods on every rank and checks no rank itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.delivery import rejection
from grpo.delivery.admission import Expected, StalenessGate, misfit
from grpo.delivery.eval_answers import AnswersAsked
from grpo.delivery.ledger import Ledger
from grpo.delivery.ordering import InOrder
from grpo.delivery.pool import SamplerPool
from grpo.runtime.refusals import note
from grpo.weights.modes.base import Vouched
from grpo.wire import messages
from grpo.wire.channels import PeerError
from grpo.wire.codec import Message, encode_batch
from grpo.wire.trainer_channel import TrainerChannel

log = logging.getLogger("grpo.trainer")

KEEPALIVE_S = 60.0  # how often next_batch calls its keepalive while no batch comes


class Endpoint(Protocol):
    """What the training loop asks of delivery, the same on every rank."""

    def next_batch(self, keepalive: Callable[[], None]) -> EpisodeBatch | None: ...
    def evaluation(self, version: int, keepalive: Callable[[], None]) -> Any: ...
    def consumed(self) -> None: ...
    def saved(self) -> None: ...
    def published(self, version: int) -> None: ...
    def finish(self) -> None: ...
    def stop(self, reason: str) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def close(self) -> None: ...


def _check_startup(waited: float, transport: TransportConfig, heard: list[str]) -> None:
    """PeerError when no sampler the trainer trusts (grpo.delivery.pool: its first batch
    admitted, or under CURVE its first message) came within transport.startup_timeout_s;
    `heard`: the ids heard of meanwhile, none vouched for."""
    if waited <= (limit := transport.startup_timeout_s):
        return
    if not heard:
        raise PeerError(
            f"no message yet from any sampler on {transport.episodes_addr} for {waited:.0f} s "
            f"(limit {limit:.0f} s): is the sampler running and connecting to this address? "
            "Check its log."
        )
    names = ", ".join(heard[:3]) + (f" and {len(heard) - 3} more" if len(heard) > 3 else "")
    raise PeerError(
        f"no batch this trainer could take for {waited:.0f} s (transport.startup_timeout_s "
        f"{limit:.0f} s), though it heard from {names}: check the sampler's log"
    )


class TrainerEndpoint:
    """Rank 0's delivery: receives, de-duplicates, admits and orders batches; announces."""

    def __init__(
        self,
        transport: TransportConfig,
        ledger: Ledger,
        expected: Expected,
        version: int,
        max_held: int,
        exit_on_stall: bool = False,
        announced: Callable[[], dict[str, Any]] = dict,
    ):
        """`ledger`, `version`: a resumed trainer's, announced from the first heartbeat on.
        `max_held`: batches held per sampler before the earliest is trained anyway.
        `announced()`: the weights body every heartbeat carries (grpo.weights.publisher.
        Publisher.announced, its mode's: opaque here)."""
        self.ledger, self.expected, self.version = ledger, expected, version
        self.order = InOrder(ledger, max_held, transport.peer_timeout_s)
        self.pool = SamplerPool(
            transport.peer_timeout_s,
            transport.stall_timeout_s,
            trusted=set(ledger.consumed),
            authenticated=bool(transport.curve_dir),
            relay_ids=frozenset(transport.relay_samplers),
        )
        self.duplicates_dropped = 0
        self.rejected_batches = 0
        self.staleness = StalenessGate(expected)
        self.transport = transport
        self.asked = AnswersAsked(self.pool.is_from)
        self._status = self._current_status()

        # Last: the channel's heartbeat thread starts reading the status at once.
        def status() -> dict[str, Any]:
            weights = announced()
            return {**self._status, "weights": weights} if weights else self._status

        self.channel = TrainerChannel(transport, status, exit_on_stall)
        self.opened_at = time.monotonic()  # transport.startup_timeout_s counts from here

    def _current_status(self) -> dict[str, Any]:
        """What every heartbeat tells the samplers (rebuilt whole on each change: the
        heartbeat thread reads it without a lock)."""
        return {
            "version": self.version,
            "acks": self.ledger.acks(),
            "consumed": self.order.received_json(),
            "trained": self.ledger.trained_counts(),
            "alive": len(self.pool.counted()),  # the samplers pace by it
            **self.asked.status(self.pool.any_vouched()),
        }

    def _refresh(self) -> None:
        self._status = self._current_status()

    def next_batch(self, keepalive: Callable[[], None]) -> EpisodeBatch:
        """The next batch to train: in its sampler's seq order, admitted (_next_in_order), and
        within the staleness bound (admission.StalenessGate). Calls `keepalive` every
        KEEPALIVE_S while none comes; raises PeerError when no sampler is left."""
        while True:
            batch = self._next_in_order(keepalive)
            if (why := self.staleness.refusal(batch, self.ledger, self.order.held)) is None:
                return batch
            self._reject(batch, why)

    def _next_in_order(self, keepalive: Callable[[], None]) -> EpisodeBatch:
        """The next batch in its sampler's seq order: never one already trained or held, never
        one this trainer cannot train on (its sampler is told why)."""
        while (batch := self.order.pop_ready()) is None:
            self._receive_and_hold(keepalive)
        return batch

    def evaluation(self, version: int, keepalive: Callable[[], None]) -> Any:
        """eval.engine: sampler: version `version`'s evaluation answers (grpo.delivery.
        eval_answers), holding the batches that come meanwhile."""
        return self.asked.wait(version, lambda: self._receive_and_hold(keepalive), self._refresh)

    def _receive_and_hold(self, keepalive: Callable[[], None]) -> None:
        """Receive for up to KEEPALIVE_S (`keepalive` after, unless answers asked for came):
        a batch that came is held for its turn if this trainer can train on it."""
        if (batch := self.receive_batch(wait_s=KEEPALIVE_S)) is None:
            if self.asked.answers is None:
                keepalive()
        elif self.order.has(batch.sampler_id, batch.seq):
            self.duplicates_dropped += 1  # a resend of a batch already trained on
            note(
                log,
                self.duplicates_dropped,
                "dropped batch %d from %s: already trained on or held (%d so far)",
                batch.seq,
                batch.sampler_id,
                self.duplicates_dropped,
                level=logging.INFO,
            )
        elif (why := self.order.too_far(batch) or misfit(batch, self.expected)) is not None:
            self._reject(batch, why)
        else:
            # Only now does the batch count as its sampler's: a refused one is no sign of
            # life, and vouches for no one (samplers pace by the pool: grpo.delivery.pool).
            self.pool.vouch(batch.sampler_id)
            self.order.hold(batch)  # and taken at once when it is the next one
            self._refresh()

    def receive_batch(self, wait_s: float | None = None) -> EpisodeBatch | None:
        """The next batch to arrive, or None if `wait_s` passed without one or the evaluation
        answers asked for came, keeping the pool up to date meanwhile.
        Raises PeerError when the samplers stop or go silent."""
        started = time.monotonic()
        while True:
            item = self.channel.receive(timeout_ms=500)
            if item is not None:
                self._heard(item)
            if isinstance(item, EpisodeBatch):
                return item
            if (
                isinstance(item, Message)
                and item.kind == messages.EVAL
                and self.asked.take(item.body, self.channel.incarnation)
            ):
                return None  # the answers `evaluation` waits for
            if isinstance(item, Message) and item.kind == messages.STOP:
                body = item.body
                reason = str(body.get("reason", "no reason given"))
                self.pool.stopped(body.get("sampler_id"), reason, body.get("incarnation"))
                self._raise_if_none_left()
            # Judge silence only once what is queued is read: after a long training step the
            # samplers' heartbeats (and next batches) are waiting here, not missing.
            if not self.channel.pending():
                self._check_pool()
            if wait_s is not None and time.monotonic() - started > wait_s:
                return None

    def _heard(self, item: EpisodeBatch | Message) -> None:
        """A message from a sampler shows it alive; its heartbeat also says what it is doing.
        A batch does not yet: only once admitted (next_batch), so that a refused one leaves no
        trace in the pool."""
        if isinstance(item, EpisodeBatch) or item.kind == messages.STOP:  # a stop: pool.stopped
            return
        sampler_id = item.body.get("sampler_id")
        if isinstance(sampler_id, str):
            heartbeat = item.kind == messages.HEARTBEAT
            self.pool.heard(sampler_id, item.body if heartbeat else None)

    def _check_pool(self) -> None:
        """Drop the samplers gone silent or stalled; raise PeerError when none is left, or
        none came within transport.startup_timeout_s."""
        self.pool.check()
        self._raise_if_none_left()
        if not self.pool.any_vouched():
            # From the endpoint's opening, not this call's: the trainer calls again every
            # KEEPALIVE_S, which would otherwise restart the clock for ever. Made-up ids
            # heard of do not stop it (they once switched it off).
            _check_startup(time.monotonic() - self.opened_at, self.transport, self.pool.alive())

    def _raise_if_none_left(self) -> None:
        if self._status["alive"] != len(self.pool.counted()):
            self._refresh()
        if (why := self.pool.none_left()) is not None:
            raise PeerError(why)

    def _reject(self, batch: EpisodeBatch, why: str) -> None:
        """Drop a batch this trainer cannot train on, and tell its sampler, which stops with
        the reason: the run goes on for any other sampler. Nothing is recorded of it (ledger,
        held batches, pool), so the real batch of that seq is still taken. The reason is
        sealed under the batch's own frames (grpo.delivery.rejection): a sampler stops only
        for its own batch, never for one another peer sent in its name, and no other
        subscriber reads what a batch must look like."""
        self.rejected_batches += 1
        note(
            log,
            self.rejected_batches,
            "dropped batch %d from %s (%d so far): %.300s",
            batch.seq,
            batch.sampler_id,
            self.rejected_batches,
            why,
        )
        sealed = rejection.seal(encode_batch(batch), why)
        self.channel.announce(
            messages.REJECTED, sampler_id=batch.sampler_id, seq=batch.seq, **sealed
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
        if self.transport.weights_addr:
            wait_for_byes(self.channel, self.pool, self._heard)

    def stop(self, reason: str) -> None:
        self.channel.announce(messages.STOP, reason=reason)

    def counters(self) -> dict[str, int]:
        return {
            "duplicates_dropped": self.duplicates_dropped,
            "rejected_frames": self.channel.rejected_frames,
            "refused_messages": self.channel.refused_messages,
            "rejected_batches": self.rejected_batches,
            "refused_evals": self.asked.refused,
            "stale_batches": self.staleness.outside,
            "samplers_alive": len(self.pool.counted()),  # the pool over time
        }

    def close(self) -> None:
        self.channel.close()


def wait_for_byes(channel: TrainerChannel, pool: SamplerPool, heard: Callable[[Any], None]) -> None:
    """After done, with weights served from here: a sampler may still be fetching a version,
    so serve until each has said bye or gone silent (`heard`: the endpoint's, for each item)."""
    waiting = set(pool.counted())
    while waiting:
        item = channel.receive(timeout_ms=500)
        if item is not None:
            heard(item)
        if isinstance(item, Message) and item.kind in (messages.BYE, messages.STOP):
            sid = item.body.get("sampler_id")
            if isinstance(sid, str) and pool.is_from(sid, item.body.get("incarnation")):
                waiting.discard(sid)
        waiting -= pool.gone_silent(waiting, "before saying bye")


class SilentEndpoint:
    """Every rank but 0: it receives batches by broadcast from rank 0 and talks to nobody."""

    def next_batch(self, keepalive: Callable[[], None]) -> None:
        return None

    def evaluation(self, version: int, keepalive: Callable[[], None]) -> None:
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


@dataclass(frozen=True)
class ModeLink:
    """A grpo.weights.modes.base.TrainerLink on rank 0's endpoint: the weights mode's trainer
    end learns of the samplers from its pool and stops the run through its channel."""

    endpoint: TrainerEndpoint
    published: int

    def members(self) -> dict[str, Vouched]:
        return self.endpoint.pool.vouched  # replaced whole, never changed: read without a lock

    def failed(self, cause: str) -> None:
        self.endpoint.channel.fail(cause)
