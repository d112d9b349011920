"""The sampler's side of delivery: exactly-once batches, and what the trainer last said.

Below it, the channel (grpo.wire.sampler_channel) moves frames, beats, and hands up each
control message from the trainer, or why it lost the trainer; above it, the sampler's loop
sends batches, waits (for the trainer, a version, room in the spool, the run's end) and reads
the trainer's status. The endpoint owns the protocol in between: what the trainer's messages
mean (its version, its acknowledgements and the batches it received, its restarts, done, stop,
a rejection), the spool (each new batch is spooled before it is sent and dropped once
acknowledged), and the resends (the whole spool after a trainer restart, a batch the trainer
passed over).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from grpo.config import TransportConfig
from grpo.core.columns import is_int
from grpo.core.episode import EpisodeBatch
from grpo.core.seqset import SeqSet
from grpo.delivery import rejection
from grpo.delivery.ledger import overtaken
from grpo.delivery.spool import Spool
from grpo.runtime.progress import ACTIVITY, IDLE_PHASES, WAITING, Snapshot
from grpo.runtime.refusals import note
from grpo.weights.modes.base import Image, Receiver
from grpo.wire import messages
from grpo.wire.channels import SocketLimits
from grpo.wire.codec import FrameError, Message
from grpo.wire.keys import ClientKeys
from grpo.wire.sampler_channel import SamplerChannel

log = logging.getLogger("grpo.sampler")

# Waiting for room in a full spool is work on delivery, not idling: a working phase (it is not in
# grpo.runtime.progress.IDLE_PHASES), so that the stall check counts it (see wait_for_room).
DELIVERING = "delivering"
# Times a batch the trainer passed over is resent before the sampler stops (see _sync).
MAX_LOST_RESENDS = 3


@dataclass
class TrainerStatus:
    """What the trainer last said: written by the channel's thread, read by the sampler's."""

    seen: bool = False  # any message from the trainer yet
    done: bool = False
    stop_reason: str | None = None
    version: int = 0
    incarnation: str | None = None  # changes when the trainer restarts
    restarts: int = 0  # trainer restarts seen
    acked: SeqSet = field(default_factory=SeqSet)  # this sampler's batches the trainer saved
    consumed: SeqSet = field(default_factory=SeqSet)  # ... it received (trained or held)
    trained: dict[str, int] = field(default_factory=dict)  # batches trained, per sampler
    alive: int = 0  # samplers the trainer counts as alive (this one included, once heard)
    activity: Snapshot | None = None  # what the trainer last said it was doing
    # The weights body of its last message (its weights mode's, opaque here: the mode's
    # receiver reads it, grpo.weights.modes.base.Receiver.heard).
    weights: dict[str, Any] = field(default_factory=dict)
    evaluate: int | None = None  # eval.engine: sampler: the version whose answers it waits for

    def take(self, body: dict[str, Any], sampler_id: str) -> bool:
        """What one control message of the trainer says, each field checked (`sampler_id`:
        this sampler's, whose acknowledgements it reads); whether it is the first of a
        restarted trainer."""
        restarted = False
        self.seen = True
        version = body.get("version")
        incarnation = body.get("incarnation")
        if isinstance(incarnation, str) and incarnation != self.incarnation:
            if self.incarnation is not None:
                # A resumed trainer may be behind the version this sampler had: follow it, and
                # forget what the old one said it trained (the new one may not have all of it).
                self.restarts += 1
                if isinstance(version, int):
                    self.version = version
                self.acked, self.consumed = SeqSet(), SeqSet()
                restarted = True
                log.warning("the trainer restarted (version %s): resending the spool", version)
            self.incarnation = incarnation
        if isinstance(version, int) and version > self.version:
            self.version = version
        trained, alive = body.get("trained"), body.get("alive")
        if isinstance(trained, dict) and all(isinstance(n, int) for n in trained.values()):
            self.trained = trained
        if isinstance(alive, int):
            self.alive = alive
        asked = body.get("evaluate")  # every message of the trainer's carries its whole status
        self.evaluate = asked if is_int(asked) else None
        if (activity := Snapshot.from_json(body)) is not None:
            self.activity = activity
        weights = body.get("weights")
        self.weights = weights if isinstance(weights, dict) else {}
        for attr, key in (("acked", "acks"), ("consumed", "consumed")):
            per_sampler = body.get(key)
            if isinstance(per_sampler, dict) and sampler_id in per_sampler:
                try:
                    setattr(self, attr, SeqSet.from_json(per_sampler[sampler_id]))
                except ValueError as e:
                    log.warning("ignored a malformed %s set from the trainer: %s", key, e)
        return restarted


class SamplerEndpoint:
    """One sampler's delivery: its batches in the spool until acknowledged, and the trainer's
    status."""

    def __init__(
        self,
        transport: TransportConfig,
        sampler_id: str,
        spool: Spool,
        exit_on_stall: bool = False,
    ):
        """`spool`: this sampler's, with what an earlier run left unacknowledged (resent once
        the trainer is heard, see wait_for_trainer). `exit_on_stall`: end the process when its
        main thread stalls (the sampler's does; tests in-process do not)."""
        self.sampler_id = sampler_id
        self.spool = spool
        self.transport = transport
        self.status = TrainerStatus()
        self.stopped = threading.Event()  # set on done, stop, a rejection, or a lost trainer
        self._news = threading.Event()  # set whenever status changes, so waiters wake at once
        self.before_close: list[Callable[[], None]] = []
        self.receiver: Receiver | None = None  # the weights mode's, once carried (carry)
        self._restarts_handled = 0
        self._resent_at: dict[int, float] = {}  # seq -> when last resent
        self._lost_resends: dict[int, int] = {}  # seq -> resends as passed over (see _sync)
        self.others_rejected = 0  # the trainer's rejections of batches others sent in its name
        # Called at each turn of every wait (the sampler's thread): what the sampler does while
        # it waits (eval.engine: sampler: answer the trainer's evaluation).
        self.on_wait: Callable[[], None] | None = None
        # Last: the channel's thread hands up what it hears at once.
        self.channel = SamplerChannel(transport, sampler_id, self._heard, self._stop, exit_on_stall)

    # ------------------------------------------------------------------ the trainer's word

    def _heard(self, msg: Message) -> None:
        """A control message from the trainer (in the channel's thread): update the status."""
        body = msg.body
        restarted = self.status.take(body, self.sampler_id)
        if self.receiver is not None:  # its weights mode's part, for the mode to read
            self.receiver.heard(self.status.weights, restarted)
        if msg.kind == messages.DONE:
            self.status.done = True
            self.stopped.set()
        elif msg.kind == messages.STOP:
            self._stop(f"{messages.TRAINER_STOPPED}: {body.get('reason', 'no reason')}")
        elif msg.kind == messages.REJECTED and body.get("sampler_id") == self.sampler_id:
            if (reason := own_rejection(body, self.spool)) is not None:
                self._stop(reason)
            else:  # a peer sends in this sampler's name: as often as it likes, so counted
                self.others_rejected += 1
                note(
                    log,
                    self.others_rejected,
                    "ignored a rejection of batch %.30r (%d so "
                    "far): not of the batch this sampler sent under that seq (another peer "
                    "used its id)",
                    body.get("seq"),
                    self.others_rejected,
                )
        self._news.set()

    def _stop(self, reason: str) -> None:
        """Stop sampling; the first reason is the one reported."""
        if self.status.stop_reason is None:
            self.status.stop_reason = reason
        self.stopped.set()
        self._news.set()

    def wake(self) -> None:
        """Have a wait_until look again now: what it waits for changed outside the trainer's
        messages (a weights version came in)."""
        self._news.set()

    def interrupt(self, reason: str) -> None:
        """A signal: stop for `reason`, whatever stopped the sampler before (the signal is
        what its exit code and its stop to the trainer report)."""
        self.status.stop_reason = reason
        self.stopped.set()

    # ------------------------------------------------------------------ batches

    def send(self, batch: EpisodeBatch, state: dict[str, Any]) -> None:
        """Spool, then record the position (`state`), then send: a crash anywhere loses
        nothing."""
        frames = self.channel.encode(batch)
        self.spool.put(batch.seq, frames)
        self.spool.write_state(state)
        self.channel.send_frames(frames, batch.seq)

    def _resend(self, seqs: list[int]) -> None:
        for seq in seqs:
            self.channel.send_frames(self.spool.frames(seq), seq)
            self._resent_at[seq] = time.monotonic()
        if seqs:
            log.info("resent %d unacknowledged batches: %s", len(seqs), seqs)

    def _sync(self) -> None:
        """Drop acknowledged batches from the spool; resend the rest after a trainer restart,
        and any batch the trainer passed over (lost on the way)."""
        status = self.status
        self.spool.acknowledge(status.acked)
        if status.restarts != self._restarts_handled:
            self._restarts_handled = status.restarts
            self._resend(self.spool.pending())
            self._lost_resends.clear()  # a new trainer: nothing passed over yet
            return
        # A resend needs a few heartbeats to show up as consumed: do not repeat it before.
        patience = 10 * self.transport.heartbeat_s
        now = time.monotonic()
        lost = [
            s
            for s in overtaken(self.spool.pending(), status.consumed)
            if now - self._resent_at.get(s, 0.0) > patience
        ]
        if not lost:
            return
        if (reason := passed_over_too_often(lost, self._lost_resends)) is not None:
            self._stop(reason)
            return
        log.warning("the trainer passed over batches %s (lost on the way): resending", lost)
        self._resend(lost)

    # ------------------------------------------------------------------ weights

    def weights_link(self, run_dir: Path, seed: Image | None) -> ReceiverLink:
        """What the weights mode's receiver takes from this endpoint (grpo.weights.in_use);
        `seed`: version 0 in memory, the first delta's base."""
        return ReceiverLink(self, run_dir, seed)

    def carry(self, receiver: Receiver) -> None:
        """From now on, hand `receiver` the weights body of every message of the trainer (the
        last one's at once), carry its own in this sampler's heartbeats, and close it before
        the channel's context ends."""
        self.before_close.append(receiver.close)
        self.channel.weights_body = receiver.announced
        self.receiver = receiver
        receiver.heard(self.status.weights, False)

    # ------------------------------------------------------------------ waits

    def wait_until(
        self, ready: Callable[[], bool], what: str, working: bool = False, own_phase: bool = False
    ) -> None:
        """Sleep until `ready()` or the sampler stops, keeping the spool in step meanwhile.

        `ready` is checked after each change of the status: it is updated before the news is
        set, so a change that lands between the check and the wait is never missed.
        `working`: the wait is in phase DELIVERING, which progresses only while the trainer
        works (see wait_for_room), instead of the idle WAITING. `own_phase`: the caller's
        working phase stays, and `ready` ticks it (a streamed version coming in: a transfer
        that stops is then a stall with that phase's name, not an idle wait)."""
        last_note = time.monotonic()
        if not own_phase:
            ACTIVITY.enter(DELIVERING if working else WAITING, f"for {what}")
        seen = self.status.activity
        while True:
            self._sync()
            if self.on_wait is not None and not self.stopped.is_set():
                self.on_wait()
            if ready() or self.stopped.is_set():
                return
            self._news.wait(timeout=5.0)
            self._news.clear()
            if working and _trainer_moved(seen, now := self.status.activity):
                ACTIVITY.tick()
                seen = now
            if time.monotonic() - last_note > 60:
                log.info("waiting for %s (trainer at version %d)", what, self.status.version)
                last_note = time.monotonic()

    def wait_for_trainer(self) -> None:
        """Wait for the trainer's first word, then resend what an earlier run left in the
        spool (the trainer drops what it already has)."""
        log.info("waiting for the trainer on %s", self.transport.control_addr)
        self.wait_until(lambda: self.status.seen, "the trainer")
        self._resend(self.spool.pending())

    def wait_for_room(self) -> None:
        """Wait while the spool is full (the trainer is behind on its acknowledgements).

        The trainer saves, and so acknowledges, at least every rollout.spool_max_batches
        batches (a config check), so a full spool waits on a trainer that is working. One that
        sits waiting itself (for a batch) will never free a slot: the two wait on each other.
        So this wait is a working phase whose counter moves with the trainer's work, and a
        stall after transport.stall_timeout_s without it: the sampler stops naming it, and the
        trainer drops it, instead of both waiting in silence."""
        self.wait_until(lambda: not self.spool.full(), "acknowledgements (spool full)", True)

    def send_eval(self, version: int, answers: dict[str, list]) -> None:
        """This sampler's answers to the evaluation of `version`, as the trainer now serving
        it (its incarnation) published it."""
        self.channel.send_control(
            messages.EVAL, version=version, trainer=self.status.incarnation, answers=answers
        )

    # ------------------------------------------------------------------ the end

    def finish(self) -> None:
        """After the trainer's done: take the final acknowledgements (done carries them) and
        say bye. Anything never acknowledged stays in the spool for a resumed run."""
        self._sync()
        if left := self.spool.pending():
            log.warning("%d batches were never acknowledged by the trainer: %s", len(left), left)
        self.channel.send_bye()

    def stop(self, reason: str) -> None:
        """Tell the trainer why this sampler stops (it names the sampler), unless the trainer
        is the one that went away."""
        if not reason.startswith((messages.TRAINER_STOPPED, messages.TRAINER_SILENT)):
            self.channel.send_stop(reason)

    def close(self) -> None:
        while self.before_close:  # what uses the channel's context (the follower) first
            self.before_close.pop()()
        self.channel.close()


def _trainer_moved(before: Snapshot | None, now: Snapshot | None) -> bool:
    """Whether the trainer's activity shows work since `before`: a new phase or progress in a
    working one. Waiting (for a batch) is not work; nor is a snapshot in DELIVERING, which no
    trainer enters: it is this process's own (trainer and sampler in one process, in tests)."""
    if now is None or now == before:
        return False
    return now.phase not in IDLE_PHASES and now.phase != DELIVERING


def own_rejection(body: dict[str, Any], spool: Spool) -> str | None:
    """The reason to stop for, when the trainer's rejection under this sampler's id is of its
    own batch (its seal opens with the spooled batch's frames: grpo.delivery.rejection); None
    when it is not.

    Stop, not drop the batch and go on: a batch this sampler builds has passed every check a
    batch can pass alone (grpo.core.columns), so the trainer refuses it only for what the two
    roles disagree on (batch shape, log-probs, vocabulary, lengths), and would refuse every
    later batch as well: going on would burn the shard. The batch stays in the spool: if the
    trainer is the one restarted with the matching config, it is trained then. A rejection
    that does not open was of a batch some other peer sent in this sampler's name, or was
    made up by a peer: it is ignored (this sampler's batch of that seq still counts)."""
    seq = body.get("seq")
    if not is_int(seq):
        return None
    try:
        frames = spool.frames(seq)
    except (OSError, FrameError):  # not (or no longer) in the spool, or damaged there
        return None
    if (reason := rejection.unseal(frames, body)) is None:
        return None
    return f"the trainer rejected batch {seq}: {reason}"


def passed_over_too_often(lost: list[int], resends: dict[int, int]) -> str | None:
    """Count a resend of each batch in `lost` (passed over by the trainer); the reason to stop
    once one was resent more than MAX_LOST_RESENDS times, else None.

    A batch lost on the way arrives when resent. One passed over again and again is refused
    on arrival where no rejection can name it (its frames fail decoding at the trainer: a spool
    file damaged on disk, a lower transport.max_frame_bytes there): resending it for ever would
    hold its spool slot for ever. Stop, naming it, rather than drop it: it is data the run has
    not trained, and the cause is on one of the two machines, for its operator to see."""
    for seq in lost:
        resends[seq] = resends.get(seq, 0) + 1
    worst = max(lost, key=resends.__getitem__)
    if resends[worst] <= MAX_LOST_RESENDS:
        return None
    return (
        f"the trainer passed over batch {worst} after it was sent and resent "
        f"{MAX_LOST_RESENDS} times: it refuses it on arrival (look for 'dropped a malformed "
        "frame' in the trainer's log); the batch stays in the spool"
    )


@dataclass(frozen=True)
class ReceiverLink:
    """A grpo.weights.modes.base.SamplerLink on this endpoint: what the weights mode's
    receiver takes from it, never the endpoint whole."""

    endpoint: SamplerEndpoint
    run_dir: Path
    seed: Image | None

    @property
    def sampler_id(self) -> str:
        return self.endpoint.sampler_id

    @property
    def ctx(self) -> zmq.Context:
        return self.endpoint.channel.ctx

    @property
    def keys(self) -> ClientKeys | None:
        return self.endpoint.channel.keys

    @property
    def limits(self) -> SocketLimits:
        return self.endpoint.channel.limits

    def secure(self, sock: zmq.Socket) -> None:
        self.endpoint.channel.secure(sock)

    def newest_version(self) -> int:
        return self.endpoint.status.version

    def wait(self, ready: Callable[[], bool], what: str) -> None:
        """In the sampler's own `receiving weights` phase, which the receiver ticks as buckets
        come in: a transfer that stops is a stall with its name, not an idle wait."""
        self.endpoint.wait_until(ready, what, own_phase=True)

    def wake(self) -> None:
        self.endpoint.wake()
