"""ZeroMQ channels between sampler and trainer, with heartbeats and timeouts.

    sampler PUSH ──episodes + heartbeats──▶ PULL trainer   (transport.episodes_addr, trainer binds)
    sampler SUB  ◀──heartbeats, done, stop── PUB trainer   (transport.control_addr, trainer binds)

Every trainer message carries its published version, its incarnation (new at each start, so a
sampler notices a restart) and its acknowledgements: per sampler, the batches its newest saved
state holds. They are cumulative, so a control message lost on the PUB socket costs nothing.

Each side runs a heartbeat thread with its own sockets (zmq sockets are not thread-safe), so a
peer busy generating or training for minutes still looks alive, and a dead one is noticed
within `peer_timeout_s`. Frames that fail to decode are logged, counted and dropped.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.delivery.ledger import Ledger, SeqSet
from grpo.wire import messages
from grpo.wire.codec import FrameError, Message, decode, encode_batch, encode_message
from grpo.wire.keys import ClientKeys, secure_server
from grpo.wire.weight_stream import WeightFetcher
from grpo.wire.weight_stream import serve as serve_weights

log = logging.getLogger("grpo.transport")


class PeerError(RuntimeError):
    """The peer is gone, silent past its timeout, or asked us to stop; the message says which."""


def _socket(ctx: zmq.Context, kind: int, linger_ms: int = 1000) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, linger_ms)
    return sock


_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def _is_loopback(addr: str) -> bool:
    return addr.startswith(("tcp://127.", "tcp://localhost:", "tcp://[::1]", "ipc://", "inproc://"))


def _bind(sock: zmq.Socket, addr: str, what: str) -> None:
    try:
        sock.bind(addr)
    except zmq.ZMQError as e:
        raise PeerError(
            f"cannot bind the {what} socket to {addr}: {e} (another run still using the port? "
            "change transport.* addresses)"
        ) from None


# ----------------------------------------------------------------------------- trainer side


class TrainerChannel:
    """Rank 0 of the trainer: receives episode batches, publishes heartbeats and done/stop."""

    def __init__(
        self,
        cfg: TransportConfig,
        version: int = 0,
        ledger: Ledger | None = None,
        run_dir: Path | None = None,
    ):
        """`version`, `ledger`: a resumed trainer's, announced from the first heartbeat on.
        `run_dir`: whose version dirs to serve on transport.weights_addr, if that is set."""
        self.cfg = cfg
        self.ctx = zmq.Context()
        self.pull = _socket(self.ctx, zmq.PULL, linger_ms=0)
        pub = _socket(self.ctx, zmq.PUB)
        router = _socket(self.ctx, zmq.ROUTER, linger_ms=0) if cfg.weights_addr else None
        servers = [s for s in (self.pull, pub, router) if s is not None]
        self._auth = None
        self.refused_handshakes = 0
        try:
            if cfg.curve_dir:
                self._auth = secure_server(self.ctx, servers, Path(cfg.curve_dir))
            elif not _is_loopback(cfg.episodes_addr):
                log.warning(
                    "listening on %s without transport.curve_dir: anyone who reaches this port "
                    "can send batches; make keys with `python -m grpo keys DIR`",
                    cfg.episodes_addr,
                )
            _bind(self.pull, cfg.episodes_addr, "episodes")
            _bind(pub, cfg.control_addr, "control")
            if router is not None:
                _bind(router, cfg.weights_addr, "weights")
        except (PeerError, ValueError):
            for sock in servers:
                sock.close()
            if self._auth is not None:
                self._auth.stop()
            self.ctx.term()
            raise
        self.rejected_frames = 0
        self.last_peer_seen: float | None = None
        self.samplers_seen: dict[str, float] = {}  # sampler id -> when last heard
        self.published_version = version
        self.incarnation = uuid.uuid4().hex[:12]
        # Replaced whole by the trainer: acks at each state save, consumed after each step.
        self.acks: dict[str, Any] = ledger.acks() if ledger else {}
        self.consumed: dict[str, Any] = ledger.consumed_json() if ledger else {}
        self._outbox: queue.Queue[Message] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat_loop, args=(pub,), daemon=True)
        self._thread.start()
        self._weights: threading.Thread | None = None
        if router is not None:
            assert run_dir is not None, "transport.weights_addr needs the run dir to serve"
            self._weights = threading.Thread(
                target=serve_weights, args=(router, run_dir, self._closing), daemon=True
            )
            self._weights.start()
        self._monitor: threading.Thread | None = None
        if self._auth is not None:  # peers speaking no CURVE never reach the key check
            monitor = self.pull.get_monitor_socket(_HANDSHAKE_FAILURES)
            self._monitor = threading.Thread(
                target=self._monitor_loop, args=(monitor,), daemon=True
            )
            self._monitor.start()

    def _monitor_loop(self, monitor: zmq.Socket) -> None:
        try:
            while not self._closing.is_set():
                if not monitor.poll(timeout=200):
                    continue
                event = recv_monitor_message(monitor)
                if event["event"] & _HANDSHAKE_FAILURES:
                    self.refused_handshakes += 1
                    log.warning(
                        "refused a connection to %s: security handshake failed (no or wrong "
                        "CURVE keys; %d refused so far)",
                        self.cfg.episodes_addr,
                        self.refused_handshakes,
                    )
        except zmq.ZMQError:
            pass  # the socket closed under us at shutdown
        finally:
            monitor.close()

    def _heartbeat_loop(self, pub: zmq.Socket) -> None:
        try:
            while True:
                try:
                    msg = self._outbox.get(timeout=self.cfg.heartbeat_s)
                except queue.Empty:
                    msg = Message(messages.HEARTBEAT, self._body())
                pub.send_multipart(encode_message(msg))
                if self._closing.is_set() and self._outbox.empty():
                    break
        except Exception:
            log.exception("the trainer's heartbeat thread failed; samplers will time out")
        finally:
            pub.close()

    def _body(self, **extra: Any) -> dict[str, Any]:
        return {
            "version": self.published_version,
            "incarnation": self.incarnation,
            "acks": self.acks,
            "consumed": self.consumed,
            **extra,
        }

    def announce(self, kind: str, **extra: Any) -> None:
        """Queue a control message (done, stop, version) for every sampler."""
        self._outbox.put(Message(kind, self._body(**extra)))

    def recv_batch(self, wait_s: float | None = None) -> EpisodeBatch | None:
        """Next episode batch, or None if `wait_s` passed without one (the caller keeps other
        ranks alive meanwhile). Raises PeerError when the sampler stops or is silent too long."""
        started = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        while True:
            # Drain what is queued before judging silence: after a long training step the
            # sampler's heartbeats (and its next batch) are waiting here, not missing.
            if poller.poll(timeout=500):
                item = self._decode(self.pull.recv_multipart(copy=False))
                if isinstance(item, EpisodeBatch):
                    return item
                if item is not None and item.kind == messages.STOP:
                    reason = item.body.get("reason", "no reason given")
                    raise PeerError(f"sampler stopped: {reason}")
            else:
                self._check_silence(started)
            if wait_s is not None and time.monotonic() - started > wait_s:
                return None

    def _decode(self, frames: list) -> EpisodeBatch | Message | None:
        try:
            item = decode(frames, max_frame_bytes=self.cfg.max_frame_bytes)
        except FrameError as e:
            self.rejected_frames += 1
            log.warning("dropped a malformed frame (%d so far): %s", self.rejected_frames, e)
            return None
        self.last_peer_seen = now = time.monotonic()
        sampler_id = (
            item.sampler_id if isinstance(item, EpisodeBatch) else item.body.get("sampler_id")
        )
        if isinstance(sampler_id, str):
            self.samplers_seen[sampler_id] = now
        return item

    def wait_for_byes(self) -> None:
        """After done, with weights served from here: samplers fetch the final version for
        their last evaluation, so serve until each has said bye or gone silent."""
        waiting = set(self.samplers_seen)
        while waiting:
            if self.pull.poll(timeout=500):
                item = self._decode(self.pull.recv_multipart(copy=False))
                if isinstance(item, Message) and item.kind in (messages.BYE, messages.STOP):
                    waiting.discard(item.body.get("sampler_id"))
            now = time.monotonic()
            silent = {s for s in waiting if now - self.samplers_seen[s] > self.cfg.peer_timeout_s}
            for sid in silent:
                log.warning("sampler %s went silent before saying bye", sid)
            waiting -= silent

    def _check_silence(self, started: float) -> None:
        if self.last_peer_seen is None:
            limit, since, what = self.cfg.startup_timeout_s, started, "message yet"
        else:
            limit, since, what = self.cfg.peer_timeout_s, self.last_peer_seen, "heartbeat"
        waited = time.monotonic() - since
        if waited > limit:
            raise PeerError(
                f"no {what} from any sampler on {self.cfg.episodes_addr} for {waited:.0f} s "
                f"(limit {limit:.0f} s): is the sampler running and connecting to this "
                "address? Check its log."
            )

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._closing.set()
        self._outbox.put(Message(messages.HEARTBEAT, self._body()))
        self._thread.join(timeout=5)
        if self._weights is not None:
            self._weights.join(timeout=5)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
            self.pull.disable_monitor()
        self.pull.close()
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()


# ----------------------------------------------------------------------------- sampler side


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
    consumed: SeqSet = field(default_factory=SeqSet)  # ... it trained on (saved or not)


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
        self._thread = threading.Thread(target=self._watch_loop, daemon=True)
        self._thread.start()

    def _socket(self, kind: int, linger_ms: int = 1000) -> zmq.Socket:
        sock = _socket(self.ctx, kind, linger_ms)
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
        heartbeat = encode_message(Message(messages.HEARTBEAT, {"sampler_id": self.sampler_id}))
        while not self._closing.is_set():
            with contextlib.suppress(zmq.Again):  # trainer not there yet: the timeouts decide
                beat.send_multipart(heartbeat)
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
        """Done with the trainer (final version fetched and evaluated)."""
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
