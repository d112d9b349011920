"""Who is in weights.mode collective's group: the trainer's announcement of it, and whom the
trainer invites into the next one. Pure: the sampler's status reads it without torch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo.core.checksum import is_hex

MAX_MEMBERS = 1024
KEY_CHARS = 32  # a generation's secret: 128 random bits in hex (secrets.token_hex(16))
# A sampler that failed groups under this many incarnations is not invited under a new one: it
# takes versions by stream. Otherwise a peer flipping its incarnation would be invited afresh
# each time and keep the group re-forming, each try waiting weights.collective_timeout_s out.
MAX_FAILED_INCARNATIONS = 3


@dataclass(frozen=True)
class GroupInfo:
    """The group the trainer formed, as its heartbeats announce it to the samplers."""

    epoch: str  # this trainer process's: a restarted one counts generations anew
    generation: int
    members: tuple[str, ...]  # sampler ids, in rank order from 1
    # The generation's secret (KEY_CHARS random hex digits): its keys in the store are under it
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "generation": self.generation,
                "members": list(self.members), "key": self.key}  # fmt: skip

    @classmethod
    def from_json(cls, body: Any) -> GroupInfo | None:
        """The trainer's announcement, or None when it names no group or is malformed."""
        if not isinstance(body, dict):
            return None
        epoch, generation, members = body.get("epoch"), body.get("generation"), body.get("members")
        key = body.get("key")
        if not (
            is_hex(key, KEY_CHARS)
            and isinstance(epoch, str)
            and 0 < len(epoch) <= 64
            and type(generation) is int
            and generation > 0
            and isinstance(members, list)
            and 0 < len(members) <= MAX_MEMBERS
            and all(isinstance(m, str) and 0 < len(m) <= 256 for m in members)
            and len(set(members)) == len(members)
        ):
            return None
        return cls(epoch, generation, tuple(members), key)

    def rank(self, sampler_id: str) -> int | None:
        """`sampler_id`'s rank in the group, None if it is not a member."""
        return self.members.index(sampler_id) + 1 if sampler_id in self.members else None


def left_generation(state: str) -> int | None:
    """The generation a sampler in state "ready:G" left (0: none yet); None if not ready."""
    kind, _, number = state.partition(":")
    return int(number) if kind == "ready" and number.isdigit() else None


def invited(
    states: Mapping[str, tuple[str, str]],
    members: tuple[str, ...],
    failed_in: Mapping[tuple[str, str], int],
) -> tuple[str, ...]:
    """Who the next group holds: the current `members`, and each sampler ready to join
    (`states`: sampler -> (incarnation, state)) that has left the generation it last failed in
    (`failed_in`, by sampler and incarnation: a restarted sampler starts afresh, up to
    MAX_FAILED_INCARNATIONS failed ones)."""
    failed_incarnations = Counter(sid for sid, _ in failed_in)

    def may_join(sid: str, incarnation: str, left: int) -> bool:
        if (sid, incarnation) in failed_in:
            return left >= failed_in[(sid, incarnation)]
        return failed_incarnations[sid] < MAX_FAILED_INCARNATIONS

    ready = {
        sid
        for sid, (incarnation, state) in states.items()
        if (left := left_generation(state)) is not None and may_join(sid, incarnation, left)
    }
    return tuple(sorted(set(members) | ready))
