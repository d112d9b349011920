"""The trainer's end of the channels: binds, receives what authorised peers send, sends
heartbeats and announcements (weights are served apart: grpo.weights.serving). What the
messages mean (which batch to train, which sampler is alive, what to acknowledge) is the
delivery layer's: grpo.delivery.trainer_endpoint."""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.runtime.lifetime import exit_soon
from grpo.runtime.progress import ACTIVITY, Watchdog
from grpo.runtime.refusals import note
from grpo.wire import messages
from grpo.wire.channels import (
    HANDSHAKE_FAILURES,
    PeerError,
    SocketLimits,
    bind,
    check_listening,
    new_socket,
)
from grpo.wire.codec import FrameError, Message, decode, encode_message
from grpo.wire.keys import AuthorizedKeys, secure_server

log = logging.getLogger("grpo.transport")


class TrainerChannel:
    """Rank 0 of the trainer: receives episode batches, publishes heartbeats and done/stop."""

    def __init__(
        self,
        cfg: TransportConfig,
        status: Callable[[], dict[str, Any]] = dict,
        exit_on_stall: bool = False,
    ):
        """`status`: what each heartbeat and announcement tells the samplers (version, acks,
        consumed, trained, alive), built by the delivery layer above (grpo.delivery.
        trainer_endpoint); the channel adds its incarnation and activity. `exit_on_stall`:
        end the process when its main thread stalls (the trainer's does; tests in-process
        do not)."""
        self.cfg = cfg
        listening = ("episodes_addr", "control_addr")
        addrs = {f"transport.{key}": getattr(cfg, key) for key in listening}
        check_listening(addrs, curve=bool(cfg.curve_dir), allow_insecure=cfg.allow_insecure)
        # Why a thread of this channel ended (the control socket's; the weights server's,
        # which reports here through `fail`): the next receive raises it, so the run stops
        # with its cause.
        self.failure: str | None = None
        self.ctx = zmq.Context()
        limits = SocketLimits.of(cfg)
        self.pull = new_socket(self.ctx, zmq.PULL, linger_ms=0, limits=limits)
        pub = new_socket(self.ctx, zmq.PUB, limits=limits)
        servers = [self.pull, pub]
        self._auth = None
        self.refused_handshakes = 0
        # With CURVE: each authorised key's sampler id; what a peer may claim to be.
        self.key_owners: AuthorizedKeys | None = None
        self.refused_messages = 0
        try:
            if cfg.curve_dir:
                self._auth = secure_server(self.ctx, servers, Path(cfg.curve_dir))
                self.key_owners = self._auth.keys
            bind(self.pull, cfg.episodes_addr, "episodes")
            bind(pub, cfg.control_addr, "control")
        except (PeerError, ValueError):
            for sock in servers:
                sock.close()
            if self._auth is not None:
                self._auth.stop()
            self.ctx.term()
            raise
        self.rejected_frames = 0
        self.incarnation = uuid.uuid4().hex[:12]
        self._status = status
        # Run in the heartbeat thread when this process's own work stalls
        # (see grpo.runtime.progress).
        self.watchdog = Watchdog(cfg.stall_timeout_s, self._stalled)
        self._exit_on_stall = exit_on_stall
        self._outbox: queue.Queue[Message] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat_loop, args=(pub,), daemon=True)
        self._thread.start()
        self._monitor: threading.Thread | None = None
        if self._auth is not None:  # peers speaking no CURVE never reach the key check
            monitor = self.pull.get_monitor_socket(HANDSHAKE_FAILURES)
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
                if event["event"] & HANDSHAKE_FAILURES:
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
                    self.watchdog.check()
                pub.send_multipart(encode_message(msg))
                if self._closing.is_set() and self._outbox.empty():
                    break
        except Exception as e:
            log.exception("the trainer's heartbeat thread failed")
            self.fail(f"the trainer's heartbeat thread failed: {type(e).__name__}: {e}")
        finally:
            pub.close()

    def fail(self, why: str) -> None:
        """A thread of this channel, or the weights server's, ended with `why` (called from
        that thread): the main thread's next receive raises it."""
        if self.failure is None:
            self.failure = why

    def _body(self, **extra: Any) -> dict[str, Any]:
        return {
            **self._status(),
            "incarnation": self.incarnation,
            **ACTIVITY.snapshot().to_json(),
            **extra,
        }

    def _stalled(self, why: str) -> None:
        """The main thread made no progress for stall_timeout_s: tell the samplers why and end
        the process, which a hung step would otherwise keep forever (torchrun then stops the
        other ranks)."""
        log.error("trainer: %s", why)
        self.announce(messages.STOP, reason=f"trainer: {why}")
        if self._exit_on_stall:
            exit_soon(f"trainer: {why}", grace_s=self.watchdog.exit_grace_s)

    def announce(self, kind: str, **extra: Any) -> None:
        """Queue a control message (done, stop, version) for every sampler."""
        self._outbox.put(Message(kind, self._body(**extra)))

    def receive(self, timeout_ms: int = 500) -> EpisodeBatch | Message | None:
        """The next batch or message from an authorised peer, or None when none came within
        `timeout_ms` (a malformed or refused one is dropped, counted and logged here).
        Raises PeerError when a thread of this channel has failed: the run stops, named."""
        if self.failure is not None:
            raise PeerError(self.failure)
        if not self.pull.poll(timeout=timeout_ms):
            return None
        return self._decode(self.pull.recv_multipart(copy=False))

    def pending(self) -> bool:
        """Something is queued to be received."""
        return bool(self.pull.poll(timeout=0))

    def _decode(self, frames: list) -> EpisodeBatch | Message | None:
        try:
            item = decode(frames, max_frame_bytes=self.cfg.max_frame_bytes)
        except FrameError as e:
            self.rejected_frames += 1
            n = self.rejected_frames
            note(log, n, "dropped a malformed frame (%d so far): %s", n, e)
            return None
        try:
            why = unauthorised(self.key_owners, frames[0], item)
        except Exception as e:  # a frame property ZeroMQ cannot give: refuse it, go on
            why = f"a message whose sender cannot be checked ({type(e).__name__}: {e})"
        if why is not None:
            self.refused_messages += 1
            n = self.refused_messages
            note(log, n, "refused a message (%d so far): %s", n, why)
            return None
        return item

    def close(self) -> None:
        if self.ctx.closed:
            return
        self._closing.set()
        try:  # a last heartbeat, which also wakes the thread at once
            self._outbox.put(Message(messages.HEARTBEAT, self._body()))
        except Exception:  # the status cannot be built: the thread wakes within heartbeat_s
            log.exception("no last heartbeat")
        self._thread.join(timeout=5)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
            self.pull.disable_monitor()
        self.pull.close()
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()


def unauthorised(
    key_owners: AuthorizedKeys | None, frame: Any, item: EpisodeBatch | Message
) -> str | None:
    """Why a peer may not send `item` (whose first frame is `frame`), or None. With CURVE
    (`key_owners`: each authorised key's sampler id), a message counts only from the key made
    for the sampler id it carries: one sampler cannot stop the run, or send or acknowledge
    batches, in another's name. Without CURVE, a stop counts only from this host: anyone who
    can reach a port open beyond loopback could send one."""
    sampler_id = item.sampler_id if isinstance(item, EpisodeBatch) else item.body.get("sampler_id")
    if key_owners is not None:
        owner = key_owners.owner(frame.get("User-Id"))
        if sampler_id != owner:
            kind = "a batch" if isinstance(item, EpisodeBatch) else f"a {item.kind}"
            return f"{kind} in the name of {sampler_id!r} with the key of {owner!r}"
    elif isinstance(item, Message) and item.kind == messages.STOP:
        peer = _peer_address(frame)
        if peer is not None and not _is_local(peer):
            return f"a stop from {peer}, not this host, on a port without CURVE"
    return None


def _peer_address(frame: Any) -> str | None:
    """The sending peer's IP address (ZeroMQ's Peer-Address property; none over ipc://)."""
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None


def _is_local(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1", "localhost")
