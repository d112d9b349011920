"""Rank 0's view of the samplers feeding it: who is alive, what each was last doing, who to drop.

The samplers are a pool: the trainer trains `train.total_steps` batches from whichever deliver.
A sampler is dropped, with a line naming it and its last activity, when it stops, when it is
silent for `transport.peer_timeout_s`, or when its heartbeats show no progress in a working
phase for `transport.stall_timeout_s`. It is back when it is heard again: a restart (a new
incarnation) after a stop, any message after silence, progress after a stall. Its batches not
yet acknowledged come back from its spool when it restarts. The run ends only when no sampler is
left alive: at once when the last one stops (a crash or a config mismatch), else when the last
one is dropped, which its own timeout has already waited for.

Anyone who can reach the trainer's sockets can send a heartbeat under any id, so a sampler the
trainer heard of is not yet one it trusts. A sampler is vouched for once a batch of its own was
admitted (or it is in a resumed trainer's ledger), or at once under CURVE (the channel takes a
message only from the key of the sampler it names). Only vouched samplers count in what the
samplers are told and act on: how many are alive (they pace by it: a thousand made-up ids would
make a lone sampler wait for a version that never comes), what the weights mode is handed of
them (`vouched`: the relays they fetch versions from, the collective group), and whom the
trainer waits for to say bye. Once one sampler is vouched
for, only vouched ones decide whether any is left (none_left): made-up ids that keep talking
cannot keep a run whose samplers are gone from ending, nor end one whose sampler is still
sending by going silent. Ids not vouched for live in a small table (MAX_UNVOUCHED) whose oldest
is evicted for a new one, so a flood of them never keeps a real sampler out, and what they
cause in the log is rate-limited (grpo.runtime.refusals).

A sampler's stop (and bye) must come from the process the trainer hears under its id: it
carries the incarnation its heartbeats do, and one naming another is ignored, so nobody who
merely knows a sampler's id can end a lone sampler's run by stopping it. (Who forges its
heartbeats as well can claim it restarted, and then stop that: without CURVE a sampler's
messages are its word, docs/reliability.md.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grpo.core.names import is_sampler_id
from grpo.runtime.progress import Snapshot, StallClock
from grpo.runtime.refusals import note
from grpo.weights.modes.base import Vouched, sampler_body

log = logging.getLogger("grpo.trainer")

STOPPED, SILENT, STALLED = "stopped", "silent", "stalled"
MAX_MEMBERS = 1024  # samplers vouched for that the trainer keeps track of
MAX_UNVOUCHED = 64  # ids heard of and not vouched for; the oldest evicted for a new one
STOP_REASON_CHARS = 200  # of a stop's reason in the log line: a peer's text, bounded
INCARNATION_CHARS = 64  # a sampler's incarnation is 12 hex digits (grpo.wire.sampler_channel)


def _incarnation(value: object) -> str | None:
    """A peer's incarnation as the pool keeps it: a short string, or none at all (a list would
    read as a restart at every heartbeat)."""
    return value if isinstance(value, str) and len(value) <= INCARNATION_CHARS else None


@dataclass
class Member:
    """One sampler as the trainer last heard it."""

    last_seen: float
    stall: StallClock
    incarnation: str | None = None
    gone: str | None = None  # STOPPED, SILENT or STALLED; None while alive
    why: str = ""  # the drop's line
    # Its heartbeats' weights body (grpo.weights.modes.base.sampler_body), for the mode alone.
    weights: dict[str, str] = field(default_factory=dict)
    vouched: bool = False  # see the module docstring

    @property
    def activity(self) -> str:
        last = self.stall.last
        return last.describe() if last is not None else "no heartbeat yet"


@dataclass
class SamplerPool:
    peer_timeout_s: float
    stall_timeout_s: float
    clock: Callable[[], float] = time.monotonic
    members: dict[str, Member] = field(default_factory=dict)
    # The live vouched samplers as the weights mode's trainer end sees them (TrainerLink.
    # members); replaced whole at each change, as the mode's threads read it.
    vouched: dict[str, Vouched] = field(default_factory=dict)
    refused: int = 0  # messages whose id the pool did not take
    evicted: int = 0  # ids not vouched for, evicted for newer ones
    strangers_said: dict[str, int] = field(default_factory=dict)  # lines about them, by kind
    # (id, incarnation) -> the reason of a stop heard before that incarnation (see stopped)
    stops_waiting: dict[tuple[str, str], str] = field(default_factory=dict)
    # Ids vouched for before they are heard (a resumed trainer's ledger); with `authenticated`
    # (CURVE) every id heard is.
    trusted: set[str] = field(default_factory=set)
    authenticated: bool = False
    # Without CURVE, the ids whose relays are told (transport.relay_samplers): a batch vouches
    # for whoever sent it, so a forger could otherwise become every sampler's first source.
    relay_ids: frozenset[str] = frozenset()

    def heard(self, sid: str, body: dict[str, Any] | None = None) -> None:
        """Any message from `sid`; a heartbeat's `body` carries its incarnation and activity.
        An id that is no sampler id is not taken (every control message carries the pool:
        grpo.core.names), nor one past MAX_MEMBERS; an id not vouched for takes the place of
        the oldest such one when there are MAX_UNVOUCHED (the module docstring)."""
        body = body or {}
        now, incarnation = self.clock(), _incarnation(body.get("incarnation"))
        member = self.members.get(sid)
        if member is None and not self._make_room(sid):
            self.refused += 1
            note(
                log,
                self.refused,
                "ignored a message from %r (%d so far): not a sampler id, or the pool holds %d",
                sid[:80],
                self.refused,
                MAX_MEMBERS,
            )
            return
        seen = None  # what the `vouched` snapshot holds of it: rebuilt only when that moves
        if member is None:
            member = self.members[sid] = Member(now, StallClock(self.clock), incarnation)
            member.vouched = self.authenticated or sid in self.trusted
            self._say(member, "joined", "sampler %s joined (%d alive)", sid, len(self.alive()))
        else:
            seen = (member.incarnation, member.weights, member.gone, member.vouched)
        restarted = incarnation is not None and incarnation != member.incarnation
        before = member.stall.last
        if (snap := Snapshot.from_json(body)) is not None:
            member.stall.see(snap)
        member.last_seen = now
        if member.gone is not None and (
            restarted
            or member.gone == SILENT
            or (member.gone == STALLED and member.stall.last != before)
        ):
            member.gone, member.why = None, ""
            self._say(
                member,
                "back",
                "sampler %s is back (%d alive)",
                sid,
                len(self.alive()),
                level=logging.WARNING,
            )
        if incarnation is not None:
            member.incarnation = incarnation
        if (weights := sampler_body(body.get("weights"))) is not None:
            member.weights = weights
        if (said := self.stops_waiting.pop((sid, member.incarnation), None)) is not None:
            self._drop(sid, STOPPED, f"sampler {sid} stopped: {said}")
        if (member.incarnation, member.weights, member.gone, member.vouched) != seen:
            self.vouched = self._vouched()

    def _make_room(self, sid: str) -> bool:
        """Whether a new member `sid` may join: a sampler id, and room for it (an id not
        vouched for evicts the oldest such one, gone ones first)."""
        if not is_sampler_id(sid):
            return False
        if self.authenticated or sid in self.trusted:
            return sum(m.vouched for m in self.members.values()) < MAX_MEMBERS
        strangers = [s for s, m in self.members.items() if not m.vouched]
        if len(strangers) >= MAX_UNVOUCHED:
            oldest = min(
                strangers, key=lambda s: (self.members[s].gone is None, self.members[s].last_seen)
            )
            del self.members[oldest]
            self.evicted += 1
        return True

    def _say(
        self, member: Member, kind: str, message: str, *args: Any, level: int = logging.INFO
    ) -> None:
        """A line about `member`: always for one vouched for, at a bounded rate by `kind` for
        the others (anyone can make up ids: grpo.runtime.refusals)."""
        if member.vouched:
            log.log(level, message, *args)
            return
        self.strangers_said[kind] = count = self.strangers_said.get(kind, 0) + 1
        if count > 10:  # past the first lines, each says how many there were
            message, args = message + " (%d such lines of ids not vouched for)", (*args, count)
        note(log, count, message, *args, level=level)

    def vouch(self, sid: str) -> None:
        """A batch of `sid`'s own was admitted: a sampler of this run, alive."""
        self.trusted.add(sid)
        self.heard(sid)
        if (member := self.members.get(sid)) is not None and not member.vouched:
            member.vouched = True
            self.vouched = self._vouched()

    def stopped(self, sid: object, reason: str, incarnation: object = None) -> None:
        """`sid` said it stops: dropped until a restart of it is heard. Taken only from the
        process heard under that id (is_from); a stop that names an incarnation not heard yet
        waits for that incarnation's heartbeat (a sampler that stops at once: its stop and its
        first heartbeat go by two sockets, either first), in a table of MAX_UNVOUCHED. Others
        are ignored: a stop in a name no sampler has ("!", a list) once ended the run with a
        KeyError, and one in a real sampler's name ended a lone sampler's run."""
        if isinstance(sid, str) and self.is_from(sid, incarnation):
            self._drop(sid, STOPPED, f"sampler {sid} stopped: {reason[:STOP_REASON_CHARS]}")
        elif is_sampler_id(sid) and (later := _incarnation(incarnation)) is not None:
            if len(self.stops_waiting) >= MAX_UNVOUCHED:
                del self.stops_waiting[next(iter(self.stops_waiting))]
            self.stops_waiting[(sid, later)] = reason[:STOP_REASON_CHARS]
        else:
            self.refused += 1
            note(
                log,
                self.refused,
                "ignored a stop for sampler %.80r (%d refused so far): not "
                "from a sampler heard under that id",
                sid,
                self.refused,
            )

    def is_from(self, sid: str, incarnation: object) -> bool:
        """Whether a message naming `sid` and `incarnation` is from the sampler heard under that
        id: it names the incarnation that sampler's heartbeats carry."""
        member = self.members.get(sid)
        return (
            member is not None
            and member.incarnation is not None
            and incarnation == member.incarnation
        )

    def check(self) -> None:
        """Drop the samplers silent or stalled for too long."""
        now = self.clock()
        for sid, member in self.members.items():
            if member.gone is not None:
                continue
            silent = now - member.last_seen
            if silent > self.peer_timeout_s:
                self._drop(
                    sid,
                    SILENT,
                    f"sampler {sid} dropped: silent for {silent:.0f} s (limit "
                    f"{self.peer_timeout_s:g} s); last seen {member.activity}",
                )
            elif (stall := member.stall.stalled(self.stall_timeout_s)) is not None:
                self._drop(sid, STALLED, f"sampler {sid} dropped: {stall}")

    def _drop(self, sid: str, kind: str, why: str) -> None:
        member = self.members[sid]
        if member.gone is not None:
            return
        member.gone, member.why = kind, why
        self.vouched = self._vouched()
        left = self.alive()
        self._say(
            member,
            "dropped",
            "%s (%d alive%s)",
            why,
            len(left),
            f": {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}" if left else "",
            level=logging.WARNING,
        )

    def gone_silent(self, sids: set[str], when: str) -> set[str]:
        """Those of `sids` not heard from for the peer timeout, each logged (`when`: what they
        went silent before)."""
        now = self.clock()
        silent = {s for s in sids if now - self.members[s].last_seen > self.peer_timeout_s}
        for sid in sorted(silent):
            log.warning("sampler %s went silent %s", sid, when)
        return silent

    def alive(self) -> list[str]:
        return sorted(sid for sid, m in self.members.items() if m.gone is None)

    def counted(self) -> list[str]:
        """The live samplers vouched for: those the samplers are told of (module docstring)."""
        return [sid for sid in self.alive() if self.members[sid].vouched]

    def _vouched(self) -> dict[str, Vouched]:
        """The live vouched samplers that said a weights body; each may be named to others as
        a source under CURVE, else only those of `relay_ids`."""
        return {
            sid: Vouched(
                m.incarnation or "", m.weights, self.authenticated or sid in self.relay_ids
            )
            for sid, m in self.members.items()
            if m.gone is None and m.vouched and m.weights
        }

    def any_vouched(self) -> bool:
        """Whether any sampler was vouched for (alive or not)."""
        return any(m.vouched for m in self.members.values())

    def none_left(self) -> str | None:
        """Why the run cannot go on, or None: every sampler vouched for is gone, or, before
        any is, every one heard of."""
        judged = [m for m in self.members.values() if m.vouched] or list(self.members.values())
        if not judged or any(m.gone is None for m in judged):
            return None
        return "no sampler left: " + "; ".join(m.why for m in judged[:8])
