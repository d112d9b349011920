"""A set of sequence numbers that stays small however many it holds: the form in which the
trainer's acknowledgements and its record of trained batches cross the wire."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SeqSet:
    """A set of sequence numbers kept small: every seq <= `low`, plus the `extra` ones above."""

    low: int = -1
    extra: set[int] = field(default_factory=set)

    def __contains__(self, seq: int) -> bool:
        return seq <= self.low or seq in self.extra

    def __len__(self) -> int:
        return self.low + 1 + len(self.extra)

    def add(self, seq: int) -> None:
        if seq < 0:
            raise ValueError(f"sequence numbers start at 0, got {seq}")
        if seq <= self.low:
            return
        self.extra.add(seq)
        while self.low + 1 in self.extra:
            self.low += 1
            self.extra.remove(self.low)

    def highest(self) -> int:
        """The largest member (-1 when empty)."""
        return max(self.extra, default=self.low)

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "extra": sorted(self.extra)}

    @classmethod
    def from_json(cls, d: Any) -> SeqSet:
        """Parse (and validate: this also arrives over the wire in acknowledgements)."""
        ok = (
            isinstance(d, dict)
            and type(d.get("low")) is int
            and d["low"] >= -1
            and isinstance(d.get("extra"), list)
            and all(type(s) is int and s > d["low"] + 1 for s in d["extra"])
        )
        if not ok:
            raise ValueError(f"not a sequence set: {d!r:.200}")
        return cls(d["low"], set(d["extra"]))
