"""Which batches the trainer has trained on, per sampler, and which of those are durable.

A batch is named by (sampler id, seq). `consumed` grows with every step; `durable` is what the
newest saved training state contains, so it is what survives a crash. The trainer acknowledges
only durable batches, drops any batch already consumed (a resend after a restart), and saves
the durable ledger inside its training state, so the two can never disagree.
"""

from __future__ import annotations

import copy
from typing import Any

from grpo.core.seqset import SeqSet


def overtaken(pending: list[int], consumed: SeqSet) -> list[int]:
    """Spooled batches the trainer passed over: not consumed although a later batch of the same
    sampler was. One connection delivers in order, so such a batch was lost on the way (dropped
    as malformed, or sent into a connection that died) and must be sent again."""
    return [seq for seq in pending if seq < consumed.highest() and seq not in consumed]


def _to_json(sets: dict[str, SeqSet]) -> dict[str, dict[str, Any]]:
    return {sid: s.to_json() for sid, s in sets.items()}


class Ledger:
    def __init__(self, durable: dict[str, SeqSet] | None = None):
        self.durable: dict[str, SeqSet] = durable or {}
        self.consumed: dict[str, SeqSet] = copy.deepcopy(self.durable)

    def is_duplicate(self, sampler_id: str, seq: int) -> bool:
        return sampler_id in self.consumed and seq in self.consumed[sampler_id]

    def consume(self, sampler_id: str, seq: int) -> None:
        self.consumed.setdefault(sampler_id, SeqSet()).add(seq)

    def mark_durable(self) -> None:
        """Call once the training state holding every consumed batch is on disk."""
        self.durable = copy.deepcopy(self.consumed)

    def acks(self) -> dict[str, dict[str, Any]]:
        return _to_json(self.durable)

    def consumed_json(self) -> dict[str, dict[str, Any]]:
        return _to_json(self.consumed)

    def trained_counts(self) -> dict[str, int]:
        """Batches trained per sampler: with the number alive, what samplers pace by."""
        return {sid: len(seqs) for sid, seqs in self.consumed.items()}

    @classmethod
    def from_acks(cls, acks: Any) -> Ledger:
        if not isinstance(acks, dict):
            raise ValueError(f"not a ledger: {acks!r:.200}")
        return cls({str(sid): SeqSet.from_json(s) for sid, s in acks.items()})
