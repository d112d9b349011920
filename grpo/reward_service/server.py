"""The reward service (ROLE=reward): a ROUTER socket that gathers score requests from any number
of samplers for up to `reward_server.batch_wait_ms` (or `max_batch` answers), scores them in
one backend call, and answers each request. With teacher.where: service it also serves the
on-policy distillation teacher: TEACHER requests (prompt and completion ids) are gathered the
same way and answered with the teacher's per-token log-probs, one forward pass over them all
(reward_server.batch_size answers per forward); a service may hold a reward backend, the
teacher, or both.

Each request id is scored once: the replies of the last `CACHE` requests are kept, and a
sampler's resend of one (after its timeout) is answered from there, as is a repeat that arrives
while the first is being scored. How gathered requests are answered, one call for all of them
and each alone when it fails, is grpo.reward_service.batches; a failure answers ERROR for the
request it fails, and the service goes on.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import zmq

from grpo.config import Config
from grpo.config.rules import serves_teacher
from grpo.reward_service import protocol
from grpo.reward_service.backends import RewardBackend, ServedTeacher, build_backend
from grpo.reward_service.batches import Counters, Request, Scoring, Teaching, answer
from grpo.reward_service.keys import secure_reward_server
from grpo.reward_service.protocol import TeacherRequest
from grpo.wire.channels import (
    PeerError,
    SocketLimits,
    bind,
    check_listening,
    derived_hwm,
    new_socket,
)
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.reward")

CACHE = 4096  # replies kept for resends: far more requests than samplers ever have in flight


class RewardServer:
    def __init__(
        self,
        addr: str,
        backend: RewardBackend | None,
        *,
        teacher: ServedTeacher | None = None,
        max_batch: int = 64,
        batch_wait_s: float = 0.02,
        max_request_items: int = 4096,
        max_frame_bytes: int = 1 << 30,
        curve_dir: str = "",
        allow_insecure: bool = False,
    ):
        if backend is None and teacher is None:
            raise ValueError("a reward service needs a reward backend, a teacher, or both")
        self.addr, self.backend, self.teacher = addr, backend, teacher
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.max_request_items, self.max_frame_bytes = max_request_items, max_frame_bytes
        self.ctx = zmq.Context()
        limits = SocketLimits(max_frame_bytes, derived_hwm(max_frame_bytes))
        self.router = new_socket(self.ctx, zmq.ROUTER, linger_ms=0, limits=limits)
        self._auth = None
        try:
            if curve_dir:
                self._auth = secure_reward_server(self.ctx, self.router, Path(curve_dir))
            check_listening({"reward.service_addr": addr}, bool(curve_dir), allow_insecure)
            bind(self.router, addr, "reward service")
        except (PeerError, ValueError):
            self.close()
            raise
        self.replies: OrderedDict[str, list[bytes]] = OrderedDict()
        self.counters = Counters()
        self.scoring = Scoring(backend) if backend is not None else None
        self.teaching = Teaching(teacher) if teacher is not None else None

    def serve(self, stop: threading.Event) -> None:
        log.info("reward service (%s) on %s", self.serves, self.addr)
        while not stop.is_set():
            pending = self.gather(stop)
            # a request of a kind this service does not serve was refused on arrival
            for job, teacher in ((self.scoring, False), (self.teaching, True)):
                mine = [r for r in pending if (r.teacher is not None) == teacher]
                if mine:
                    assert job is not None
                    answer(self, job, mine)

    @property
    def serves(self) -> str:
        names = [self.backend.name] if self.backend is not None else []
        return " and ".join(names + (["the teacher"] if self.teacher is not None else []))

    def gather(self, stop: threading.Event) -> list[Request]:
        """Requests to score together: those that arrive within batch_wait_s of the first, up
        to max_batch answers."""
        pending: list[Request] = []
        first_at = 0.0
        while not stop.is_set():
            wait_s = 0.2 if not pending else first_at + self.batch_wait_s - time.monotonic()
            if pending and (wait_s <= 0 or sum(r.size for r in pending) >= self.max_batch):
                return pending
            if self.router.poll(timeout=max(int(wait_s * 1000), 0)):
                request = self.receive(pending)
                if request is not None:
                    first_at = first_at if pending else time.monotonic()
                    pending.append(request)
        return pending

    def receive(self, pending: list[Request]) -> Request | None:
        """One message: a new request to score, or None when it was answered (ping, cached
        reply, error) or dropped (a repeat in flight, garbage). Whatever handling it raises is
        that message's failure alone: answered with an error, and the service goes on."""
        peer, *frames = self.router.recv_multipart()
        try:
            return self._request(peer, frames, pending)
        except Exception as e:
            self.counters.refused += 1
            log.exception(
                "a request the service could not handle (%d refused so far)", self.counters.refused
            )
            self.answer_error(peer, _request_id(frames), f"{type(e).__name__}: {e}")
            return None

    def _request(self, peer: bytes, frames: list[bytes], pending: list[Request]) -> Request | None:
        try:
            msg = decode(frames, max_frame_bytes=self.max_frame_bytes)
            if not isinstance(msg, Message):
                raise FrameError("an episode batch sent to the reward service")
        except FrameError as e:
            self.counters.refused += 1
            log.warning("dropped a malformed frame (%d so far): %s", self.counters.refused, e)
            return None
        if msg.kind == protocol.PING:
            backend = self.backend.name if self.backend is not None else ""
            self.reply(
                peer,
                Message(protocol.PONG, {"backend": backend, "teacher": self.teacher is not None}),
            )
            return None
        items, teacher = [], None
        try:
            if msg.kind == protocol.SCORE:
                if self.backend is None:
                    raise ValueError(
                        "this reward service has no reward backend "
                        "(reward_server.backend): it serves the teacher only"
                    )
                rid, items = protocol.parse_request(msg.body, self.max_request_items)
            elif msg.kind == protocol.TEACHER:
                rid, teacher = self._teacher_request(msg.body)
            else:
                raise ValueError(f"unknown request kind {msg.kind!r}")
        except ValueError as e:
            self.counters.refused += 1
            rid = msg.body.get("id") if isinstance(msg.body.get("id"), str) else ""
            body = {"id": rid, "reason": str(e)[:2000]}
            if isinstance(e, TokenizerMismatch):
                body["code"] = protocol.TOKENIZER_MISMATCH
            log.warning(
                "refused request %s (%d refused so far): %s",
                rid[:8],
                self.counters.refused,
                str(e)[:300],
            )
            self.reply(peer, Message(protocol.ERROR, body))
            return None
        if rid in self.replies:  # a resend of one already scored
            self.counters.repeats += 1
            self.router.send_multipart([peer, *self.replies[rid]])
            return None
        if any(r.rid == rid for r in pending):  # a resend of one about to be scored
            self.counters.repeats += 1
            return None
        self.counters.requests += 1
        return Request(peer, rid, items, teacher)

    def _teacher_request(self, body: dict) -> tuple[str, TeacherRequest]:
        """A TEACHER body, checked against the teacher's limits and tokenizer."""
        if self.teaching is None:
            raise ValueError("this reward service serves no teacher (teacher.where: service)")
        t = self.teaching.teacher
        rid, request = protocol.parse_teacher_request(
            body, self.max_request_items, t.max_tokens, t.vocab_size
        )
        difference = t.tokenizer_difference(request.tokenizer)
        if difference is not None:
            raise TokenizerMismatch(
                f"teacher.path {t.path!r} has another tokenizer than the sampler's student: "
                f"{difference}; on-policy distillation needs the same one"
            )
        return rid, request

    def _keep(self, rid: str, frames: list[bytes]) -> None:
        self.replies[rid] = frames
        while len(self.replies) > CACHE:
            self.replies.popitem(last=False)

    def send_each(
        self,
        pending: list[Request],
        results: list,
        what: str,
        reply: Callable[[Request, list], Message],
    ) -> None:
        """One batched call's `results`, one per answer in request order, each request's share
        sent to it as `reply` builds it. A reply that cannot be encoded (an info msgpack cannot
        carry, a NaN log-prob) fails its own request alone."""
        start = 0
        for r in pending:
            mine = results[start : start + r.size]
            start += r.size
            try:
                frames = encode_message(reply(r, mine))
            except Exception as e:
                log.warning("the %s of request %s cannot be sent: %s", what, r.rid[:8], e)
                self.answer_error(r.peer, r.rid, f"its {what} cannot be sent: {e}")
                continue
            self._keep(r.rid, frames)
            self.router.send_multipart([r.peer, *frames])

    def answer_error(self, peer: bytes, rid: str, reason: str) -> None:
        self.reply(peer, Message(protocol.ERROR, {"id": rid, "reason": reason[:2000]}))

    def reply(self, peer: bytes, msg: Message) -> None:
        self.router.send_multipart([peer, *encode_message(msg)])

    def close(self) -> None:
        if self.ctx.closed:
            return
        self.router.close()
        if self._auth is not None:
            self._auth.stop()
        self.ctx.term()


class TokenizerMismatch(ValueError):
    """A TEACHER request from a sampler whose tokenizer is not the teacher's."""


def _request_id(frames: list[bytes]) -> str:
    """The id of a request whose handling failed, if it can be read, to answer it by; ''."""
    try:
        msg = decode(frames)
        rid = msg.body.get("id") if isinstance(msg, Message) else None
    except Exception:
        return ""
    return rid if isinstance(rid, str) else ""


def run_reward_server(cfg: Config) -> int:
    """ROLE=reward: load the backend and/or the teacher, serve until SIGTERM or Ctrl-C."""
    s = cfg.reward_server
    if not cfg.reward.service_addr or not (s.backend or serves_teacher(cfg)):
        raise ValueError(
            "ROLE=reward needs reward.service_addr (where to listen) and reward_server.backend "
            "(classifier, judge or 'package.module:build') or a teacher to serve (teacher.path "
            "with teacher.where=service)"
        )
    t0 = time.monotonic()
    backend = build_backend(cfg) if s.backend else None
    teacher = ServedTeacher.load(cfg) if serves_teacher(cfg) else None
    loaded = [f"the {backend.name} backend"] if backend else []
    loaded += [f"the teacher {cfg.teacher.path}"] if teacher else []
    log.info("loaded %s in %.1f s", " and ".join(loaded), time.monotonic() - t0)
    server = RewardServer(
        cfg.reward.service_addr,
        backend,
        teacher=teacher,
        max_batch=s.max_batch,
        batch_wait_s=s.batch_wait_ms / 1000,
        max_frame_bytes=cfg.transport.max_frame_bytes,
        curve_dir=cfg.transport.curve_dir,
        allow_insecure=cfg.transport.allow_insecure,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.serve(stop)
    finally:
        server.close()
        c = server.counters
        log.info(
            "reward service stopping: %d requests, %d answers scored in %d backend calls "
            "(%.1f s), %d answers' tokens scored by the teacher in %d calls, %d repeats "
            "answered once, %d refused, %d backend failures",
            c.requests,
            c.answers,
            c.backend_calls,
            c.seconds,
            c.teacher_answers,
            c.teacher_calls,
            c.repeats,
            c.refused,
            c.failures,
        )
    return 0
