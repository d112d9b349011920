"""Each sampler's batches are trained in seq order, so a run that crashed and resumed trains the
same batches in the same order as one that did not, and ends with the same weights.

Batches can arrive out of order after a restart: one sent before the crash waits in ZeroMQ's
queue and arrives before the resent ones before it. The trainer holds such a batch until its
predecessors are trained. The held ones count as received in the heartbeats (grpo.delivery.
ledger.overtaken), so the sampler resends a predecessor that was lost on the way. Two limits
keep a batch that never comes from stopping the run: more than `max_held` batches held for one
sampler, or one held for longer than `patience_s`, and the earliest held is trained anyway,
with a warning naming the missing ones.

A sampler holds at most `rollout.spool_max_batches` batches unacknowledged, every one of them
from the first the trainer has not trained on, so no real batch lies further ahead than that
(counting only the seqs not yet trained: out of order ones free their spool slots). A seq
beyond it is refused before it is held: one of 2^40 once made a log line of a range's every
number and ran the trainer out of memory.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

from grpo.core.episode import EpisodeBatch
from grpo.core.seqset import SeqSet
from grpo.delivery.ledger import Ledger

log = logging.getLogger("grpo.trainer")


class InOrder:
    """Rank 0's batches held until their predecessors are trained (the module docstring)."""

    def __init__(self, ledger: Ledger, max_held: int, patience_s: float):
        self.ledger = ledger
        self.max_held = max_held
        self.patience_s = patience_s
        self.held: dict[str, dict[int, tuple[EpisodeBatch, float]]] = {}

    def next_seq(self, sampler_id: str) -> int:
        """The seq this sampler's next trained batch must have: the first not trained."""
        consumed = self.ledger.consumed.get(sampler_id)
        return 0 if consumed is None else consumed.low + 1

    def has(self, sampler_id: str, seq: int) -> bool:
        """Trained on, or held until its predecessors are: a resend after a restart."""
        return self.ledger.is_duplicate(sampler_id, seq) or seq in self.held.get(sampler_id, {})

    def too_far(self, batch: EpisodeBatch) -> str | None:
        """Why `batch` cannot be a batch its sampler holds (the module docstring), or None."""
        sid, seq = batch.sampler_id, batch.seq
        first = self.next_seq(sid)
        consumed = self.ledger.consumed.get(sid)
        trained_ahead = sum(s < seq for s in consumed.extra) if consumed is not None else 0
        if seq - first + 1 - trained_ahead <= self.max_held:
            return None
        return (
            f"its seq {seq} is further ahead of the first batch of {sid} not yet trained "
            f"({first}) than the {self.max_held} a sampler holds unacknowledged: start both "
            "roles with the same rollout.spool_max_batches"
        )

    def hold(self, batch: EpisodeBatch) -> None:
        self.held.setdefault(batch.sampler_id, {})[batch.seq] = (batch, time.monotonic())

    def pop_ready(self) -> EpisodeBatch | None:
        """A held batch to train now: the next of its sampler, or the earliest of a sampler
        that waited too long (too many held, or for too long) for a batch before it."""
        now = time.monotonic()
        for sid, mine in self.held.items():
            first = min(mine)
            overdue = len(mine) > self.max_held or now - mine[first][1] > self.patience_s
            if first == self.next_seq(sid) or overdue:
                if first != self.next_seq(sid):  # a range: a peer's seq can be any size
                    gap = (self.next_seq(sid), first - 1)
                    log.warning(
                        "training batch %d from %s out of order: batches %d to %d never came",
                        first,
                        sid,
                        *gap,
                    )
                batch, _ = mine.pop(first)
                if not mine:
                    del self.held[sid]
                return batch
        return None

    def received_json(self) -> dict[str, dict[str, Any]]:
        """Trained or held, per sampler: what the heartbeats report as consumed, so that a
        sampler resends only what never arrived."""
        out = {}
        for sid in self.ledger.consumed.keys() | self.held.keys():
            seqs = copy.deepcopy(self.ledger.consumed.get(sid, SeqSet()))
            for seq in self.held.get(sid, {}):
                seqs.add(seq)
            out[sid] = seqs.to_json()
        return out
