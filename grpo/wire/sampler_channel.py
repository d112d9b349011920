"""A sampler's end of the channels: connects, sends batches, heartbeats and control messages,
hands up what the trainer's control stream says (weights come apart: grpo.weights.modes). What
the trainer's messages mean (versions, acknowledgements, done, stop, rejections) is the
delivery layer's: grpo.delivery.sampler_endpoint."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.runtime.lifetime import exit_soon
from grpo.runtime.progress import ACTIVITY, Watchdog
from grpo.wire import messages
from grpo.wire.channels import PeerError, SocketLimits, new_socket
from grpo.wire.codec import FrameError, Message, decode, encode_batch, encode_message
from grpo.wire.keys import ClientKeys

log = logging.getLogger("grpo.transport")


def _ignore(_: Message | str) -> None:
    """What a channel with nobody above it (a test, a benchmark) does with what it hears."""


class SamplerChannel:
    """The sampler's end: pushes batches, heartbeats, and watches the trainer's control stream."""

    def __init__(
        self,
        cfg: TransportConfig,
        sampler_id: str,
        heard: Callable[[Message], None] = _ignore,
        lost: Callable[[str], None] = _ignore,
        exit_on_stall: bool = False,
    ):
        """`heard`: called with each control message from the trainer. `lost`: called with the
        reason when the trainer is silent past its timeout (once), this channel's thread fails,
        or this process's main thread stalls. Both run in the channel's thread, which starts
        at once; the delivery layer above (grpo.delivery.sampler_endpoint) interprets them.
        `exit_on_stall`: end the process when its main thread stalls (the sampler's does;
        tests in-process do not)."""
        self.cfg = cfg
        self.sampler_id = sampler_id
        self.keys = ClientKeys.load(Path(cfg.curve_dir), sampler_id) if cfg.curve_dir else None
        self.ctx = zmq.Context()
        self.limits = SocketLimits.of(cfg)
        self.push = self._socket(zmq.PUSH)
        # What its heartbeats carry for the weights mode's trainer end, under "weights" (its
        # receiver's, grpo.weights.modes.base.Receiver.announced; opaque here).
        self.weights_body: Callable[[], dict[str, str]] = dict
        self.push.setsockopt(zmq.SNDTIMEO, int(cfg.peer_timeout_s * 1000))
        self.push.connect(cfg.episodes_addr)
        self._heard, self._lost = heard, lost
        self._closing = threading.Event()
        self.incarnation = uuid.uuid4().hex[:12]  # this process: the trainer tells restarts apart
        # Run in the watch thread when this process's own work stalls (see grpo.runtime.progress).
        self.watchdog = Watchdog(cfg.stall_timeout_s, self._stalled)
        self._exit_on_stall = exit_on_stall
        self._thread = threading.Thread(target=self._watch_loop, daemon=True)
        self._thread.start()

    def _socket(self, kind: int, linger_ms: int = 1000) -> zmq.Socket:
        sock = new_socket(self.ctx, kind, linger_ms, limits=self.limits)
        self.secure(sock)
        return sock

    def secure(self, sock: zmq.Socket) -> None:
        if self.keys is not None:
            self.keys.apply(sock)

    def _watch_loop(self) -> None:
        sub = self._socket(zmq.SUB, linger_ms=0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.cfg.control_addr)
        beat = self._socket(zmq.PUSH, linger_ms=0)
        beat.setsockopt(zmq.SNDTIMEO, 0)
        beat.connect(self.cfg.episodes_addr)
        try:
            self._watch(sub, beat)
        except Exception as e:  # never die silently: the main loop must learn of it
            log.exception("the sampler's watch thread failed")
            self._lost(f"the sampler's heartbeat thread failed: {type(e).__name__}: {e}")
        finally:
            sub.close()
            beat.close()

    def _watch(self, sub: zmq.Socket, beat: zmq.Socket) -> None:
        started, last_seen, silent = time.monotonic(), None, False
        self._beat = beat  # for _stalled, which the watchdog calls from this thread
        while not self._closing.is_set():
            self.watchdog.check()
            body = {
                "sampler_id": self.sampler_id,
                "incarnation": self.incarnation,
                **({"weights": weights} if (weights := self.weights_body()) else {}),
                **ACTIVITY.snapshot().to_json(),
            }
            with contextlib.suppress(zmq.Again):  # trainer not there yet: the timeouts decide
                beat.send_multipart(encode_message(Message(messages.HEARTBEAT, body)))
            if sub.poll(timeout=int(self.cfg.heartbeat_s * 1000)):
                last_seen = time.monotonic()
                self._receive(sub.recv_multipart())
            limit = self.cfg.startup_timeout_s if last_seen is None else self.cfg.peer_timeout_s
            waited = time.monotonic() - (started if last_seen is None else last_seen)
            if waited > limit and not silent:
                silent = True
                self._lost(
                    f"{messages.TRAINER_SILENT} on {self.cfg.control_addr} for {waited:.0f} s "
                    f"(limit {limit:.0f} s): is the trainer running? Check its log."
                )

    def _stalled(self, why: str) -> None:
        """The main thread made no progress for stall_timeout_s: stop, tell the trainer (from
        this thread's socket: the main thread's is busy), and end the process if the main
        thread is stuck where the stop flag does not reach."""
        log.error("sampler %s: %s", self.sampler_id, why)
        self._lost(why)
        stop = Message(
            messages.STOP,
            {"sampler_id": self.sampler_id, "incarnation": self.incarnation, "reason": why},
        )
        with contextlib.suppress(zmq.Again):
            self._beat.send_multipart(encode_message(stop))
        if self._exit_on_stall:
            exit_soon(f"sampler {self.sampler_id}: {why}", grace_s=self.watchdog.exit_grace_s)

    def _receive(self, frames: list[bytes]) -> None:
        """Hand a control message up; a malformed frame is dropped here (logged)."""
        try:
            msg = decode(frames, max_frame_bytes=self.cfg.max_frame_bytes)
        except FrameError as e:
            log.warning("dropped a malformed control frame: %s", e)
            return
        if isinstance(msg, Message):
            self._heard(msg)

    def encode(self, batch: EpisodeBatch) -> list[Any]:
        """The batch's frames, refused here (PeerError) if the trainer would drop them as too
        large."""
        frames = encode_batch(batch)
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self.cfg.max_frame_bytes:
            raise PeerError(
                f"batch {batch.seq} encodes to {size} bytes, over transport.max_frame_bytes "
                f"({self.cfg.max_frame_bytes}); the trainer would drop it: raise the limit on "
                "both roles or sample fewer / shorter answers"
            )
        return frames

    def send_batch(self, batch: EpisodeBatch) -> None:
        self.send_frames(self.encode(batch), batch.seq)

    def send_frames(self, frames: list[Any], seq: int) -> None:
        """Send an encoded batch (new or resent from the spool)."""
        try:
            self.push.send_multipart(frames, copy=False)
        except zmq.Again:
            raise PeerError(
                f"could not hand batch {seq} to the trainer at {self.cfg.episodes_addr} "
                f"within {self.cfg.peer_timeout_s:.0f} s: is the trainer running?"
            ) from None

    def send_stop(self, reason: str) -> None:
        self.send_control(messages.STOP, reason=reason)

    def send_bye(self) -> None:
        """Done with the trainer: it may stop serving weights."""
        self.send_control(messages.BYE)

    def send_control(self, kind: str, **body: Any) -> None:
        """A control message for the trainer (a stop, a bye, evaluation answers)."""
        # The incarnation: the trainer takes a stop or bye only from the process it hears
        # under this id (grpo.delivery.pool).
        message = Message(
            kind, {"sampler_id": self.sampler_id, "incarnation": self.incarnation, **body}
        )
        with contextlib.suppress(zmq.Again):
            self.push.send_multipart(encode_message(message))

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._closing.set()
        self._thread.join(timeout=self.cfg.heartbeat_s + 5)
        self.push.close()
        self.ctx.term()
