"""A sampler's end of the channels: connects, sends batches and heartbeats, follows the
trainer's status (versions, acknowledgements, done, stop, rejections), fetches weights."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.core.seqset import SeqSet
from grpo.runtime.lifetime import exit_soon
from grpo.runtime.progress import ACTIVITY, Watchdog
from grpo.wire import messages
from grpo.wire.channels import PeerError, new_socket
from grpo.wire.codec import FrameError, Message, decode, encode_batch, encode_message
from grpo.wire.keys import ClientKeys
from grpo.wire.weight_stream import WeightFetcher

log = logging.getLogger("grpo.transport")


@dataclass
class TrainerStatus:
    """What the sampler's heartbeat thread last heard from the trainer."""

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


class SamplerChannel:
    """The sampler's end: pushes batches, heartbeats, and watches the trainer's control stream."""

    def __init__(self, cfg: TransportConfig, sampler_id: str):
        self.cfg = cfg
        self.sampler_id = sampler_id
        self.keys = ClientKeys.load(Path(cfg.curve_dir), sampler_id) if cfg.curve_dir else None
        self.ctx = zmq.Context()
        self.push = self._socket(zmq.PUSH)
        self.weights = (
            WeightFetcher(self.ctx, cfg.weights_addr, cfg.peer_timeout_s, self._secure)
            if cfg.weights_addr
            else None
        )
        self.push.setsockopt(zmq.SNDTIMEO, int(cfg.peer_timeout_s * 1000))
        self.push.connect(cfg.episodes_addr)
        self.status = TrainerStatus()
        self.stopped = threading.Event()  # set on done, stop, or a silent trainer
        self._news = threading.Event()  # set whenever status changes, so waiters wake at once
        self._closing = threading.Event()
        self.incarnation = uuid.uuid4().hex[:12]  # this process: the trainer tells restarts apart
        # Run in the watch thread when this process's own work stalls (see grpo.runtime.progress).
        self.watchdog = Watchdog(cfg.stall_timeout_s, self._stalled)
        self.exit_on_stall = False  # the sampler's process sets it; tests in-process do not
        self._thread = threading.Thread(target=self._watch_loop, daemon=True)
        self._thread.start()

    def _socket(self, kind: int, linger_ms: int = 1000) -> zmq.Socket:
        sock = new_socket(self.ctx, kind, linger_ms)
        self._secure(sock)
        return sock

    def _secure(self, sock: zmq.Socket) -> None:
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
            self._stop(f"the sampler's heartbeat thread failed: {type(e).__name__}: {e}")
        finally:
            sub.close()
            beat.close()

    def _watch(self, sub: zmq.Socket, beat: zmq.Socket) -> None:
        started, last_seen = time.monotonic(), None
        self._beat = beat  # for _stalled, which the watchdog calls from this thread
        while not self._closing.is_set():
            self.watchdog.check()
            body = {
                "sampler_id": self.sampler_id,
                "incarnation": self.incarnation,
                **ACTIVITY.snapshot().to_json(),
            }
            with contextlib.suppress(zmq.Again):  # trainer not there yet: the timeouts decide
                beat.send_multipart(encode_message(Message(messages.HEARTBEAT, body)))
            if sub.poll(timeout=int(self.cfg.heartbeat_s * 1000)):
                last_seen = time.monotonic()
                self._on_control(sub.recv_multipart())
            limit = self.cfg.startup_timeout_s if last_seen is None else self.cfg.peer_timeout_s
            waited = time.monotonic() - (started if last_seen is None else last_seen)
            if waited > limit and not self.stopped.is_set():
                self._stop(
                    f"{messages.TRAINER_SILENT} on {self.cfg.control_addr} for {waited:.0f} s "
                    f"(limit {limit:.0f} s): is the trainer running? Check its log."
                )

    def _stalled(self, why: str) -> None:
        """The main thread made no progress for stall_timeout_s: stop, tell the trainer (from
        this thread's socket: the main thread's is busy), and end the process if the main
        thread is stuck where the stop flag does not reach."""
        log.error("sampler %s: %s", self.sampler_id, why)
        self._stop(why)
        stop = Message(messages.STOP, {"sampler_id": self.sampler_id, "reason": why})
        with contextlib.suppress(zmq.Again):
            self._beat.send_multipart(encode_message(stop))
        if self.exit_on_stall:
            exit_soon(f"sampler {self.sampler_id}: {why}", grace_s=self.watchdog.exit_grace_s)

    def _stop(self, reason: str) -> None:
        if self.status.stop_reason is None:
            self.status.stop_reason = reason
        self.stopped.set()
        self._news.set()

    def wait_for_news(self, timeout_s: float) -> None:
        """Sleep until the trainer's status changes (a new version, done, stop) or timeout_s.

        Callers re-check the status after each wake-up: it is updated before the news is set,
        so a change that lands between the check and the wait is never missed."""
        self._news.wait(timeout_s)
        self._news.clear()

    def _on_control(self, frames: list[bytes]) -> None:
        try:
            msg = decode(frames, max_frame_bytes=self.cfg.max_frame_bytes)
        except FrameError as e:
            log.warning("dropped a malformed control frame: %s", e)
            return
        if not isinstance(msg, Message):
            return
        status, body = self.status, msg.body
        status.seen = True
        version = body.get("version")
        incarnation = body.get("incarnation")
        if isinstance(incarnation, str) and incarnation != status.incarnation:
            if status.incarnation is not None:
                # A resumed trainer may be behind the version this sampler had: follow it, and
                # forget what the old one said it trained (the new one may not have all of it).
                status.restarts += 1
                if isinstance(version, int):
                    status.version = version
                status.acked, status.consumed = SeqSet(), SeqSet()
                log.warning("the trainer restarted (version %s): resending the spool", version)
            status.incarnation = incarnation
        if isinstance(version, int) and version > status.version:
            status.version = version
        trained, alive = body.get("trained"), body.get("alive")
        if isinstance(trained, dict) and all(isinstance(n, int) for n in trained.values()):
            status.trained = trained
        if isinstance(alive, int):
            status.alive = alive
        for attr, key in (("acked", "acks"), ("consumed", "consumed")):
            per_sampler = body.get(key)
            if isinstance(per_sampler, dict) and self.sampler_id in per_sampler:
                try:
                    setattr(status, attr, SeqSet.from_json(per_sampler[self.sampler_id]))
                except ValueError as e:
                    log.warning("ignored a malformed %s set from the trainer: %s", key, e)
        if msg.kind == messages.DONE:
            self.status.done = True
            self.stopped.set()
        elif msg.kind == messages.STOP:
            self._stop(f"{messages.TRAINER_STOPPED}: {msg.body.get('reason', 'no reason')}")
        elif msg.kind == messages.REJECTED and body.get("sampler_id") == self.sampler_id:
            self._stop(f"the trainer rejected batch {body.get('seq')}: {body.get('reason')}")
        self._news.set()

    def check_size(self, frames: list[Any], seq: int) -> None:
        size = sum(memoryview(f).nbytes for f in frames)
        if size > self.cfg.max_frame_bytes:
            raise PeerError(
                f"batch {seq} encodes to {size} bytes, over transport.max_frame_bytes "
                f"({self.cfg.max_frame_bytes}); the trainer would drop it: raise the limit on "
                "both roles or sample fewer / shorter answers"
            )

    def send_batch(self, batch: EpisodeBatch) -> None:
        frames = encode_batch(batch)
        self.check_size(frames, batch.seq)
        self.send_frames(frames, batch.seq)

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
        self._send_control(messages.STOP, reason=reason)

    def send_bye(self) -> None:
        """Done with the trainer: it may stop serving weights."""
        self._send_control(messages.BYE)

    def _send_control(self, kind: str, **body: Any) -> None:
        message = Message(kind, {"sampler_id": self.sampler_id, **body})
        with contextlib.suppress(zmq.Again):
            self.push.send_multipart(encode_message(message))

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._closing.set()
        self._thread.join(timeout=self.cfg.heartbeat_s + 5)
        self.push.close()
        if self.weights is not None:
            self.weights.close()
        self.ctx.term()
