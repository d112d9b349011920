"""The sampler's end of the reward service, and the run's reward when it uses one.

`RewardClient.score` sends the answers in requests of `reward.service_batch`, all at once, and
waits for their replies, each with `reward.service_timeout_s`. A request without a reply is
sent again with the same id (the service answers a repeat from its cache, so nothing is scored
twice) up to `reward.service_retries` times; then, with `reward.on_service_failure: fail`, the
sampler stops with a line naming the service; with `wait`, it keeps resending, saying so,
until the service is back. An ERROR reply scores its answers 0 with the reason as
`reward_error`, as a failing rule reward does.

`combine` is the run's reward: the weighted sum of the task's rule reward and the service's,
each kept in the reward info.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from grpo.reward_service import protocol
from grpo.reward_service.keys import client_keys
from grpo.reward_service.protocol import Item
from grpo.runtime.progress import ACTIVITY, WAITING
from grpo.wire.channels import PeerError, SocketLimits, derived_hwm, new_socket
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.sampler")

Scored = tuple[float, dict[str, Any]]
FAIL, WAIT = "fail", "wait"


class RewardServiceError(PeerError):
    """The reward service did not answer and reward.on_service_failure is fail."""


@dataclass
class _Request:
    items: Sequence[Item]
    frames: list[bytes]
    sent_at: float
    tries: int = 1


class RewardClient:
    def __init__(
        self,
        addr: str,
        *,
        timeout_s: float = 60.0,
        retries: int = 2,
        on_failure: str = FAIL,
        batch: int = 64,
        curve_dir: str = "",
        sampler_id: str = "sampler-0",
        stop_event: threading.Event | None = None,
        max_frame_bytes: int = 1 << 30,
    ):
        if on_failure not in (FAIL, WAIT):
            raise ValueError(f"on_failure must be {FAIL!r} or {WAIT!r}, got {on_failure!r}")
        self.addr, self.timeout_s, self.retries = addr, timeout_s, retries
        self.on_failure, self.batch = on_failure, batch
        self.stop_event = stop_event or threading.Event()
        self.max_frame_bytes = max_frame_bytes
        self.ctx = zmq.Context()
        limits = SocketLimits(max_frame_bytes, derived_hwm(max_frame_bytes))
        self.sock = new_socket(self.ctx, zmq.DEALER, linger_ms=0, limits=limits)
        if curve_dir:
            client_keys(Path(curve_dir), sampler_id).apply(
                self.sock
            )  # reward.key, not the trainer's
        self.sock.connect(addr)
        self.resends = 0

    def score(self, items: Sequence[Item]) -> list[Scored]:
        """(reward, info) per item, in order: every item scored once."""
        pending: dict[str, _Request] = {}
        for start in range(0, len(items), self.batch):
            chunk = items[start : start + self.batch]
            rid = uuid.uuid4().hex
            body = {"id": rid, "items": [it.to_json() for it in chunk]}
            pending[rid] = _Request(chunk, encode_message(Message(protocol.SCORE, body)), 0.0)
        order = list(pending)
        results: dict[str, list[Scored]] = {}
        for request in pending.values():
            self._send(request)
        # Waiting on a peer, not working: its silence is judged by service_timeout_s, not by
        # the stall check (grpo.runtime.progress).
        with ACTIVITY.during(WAITING, f"for the reward service at {self.addr}"):
            while pending:
                if self.stop_event.is_set():
                    raise PeerError("stopped while waiting for the reward service")
                if self.sock.poll(timeout=200):
                    self._receive(pending, results)
                self._resend_overdue(pending)
        return [scored for rid in order for scored in results[rid]]

    def _send(self, request: _Request) -> None:
        request.sent_at = time.monotonic()
        self.sock.send_multipart(request.frames)

    def _receive(self, pending: dict[str, _Request], results: dict[str, list[Scored]]) -> None:
        try:
            msg = decode(self.sock.recv_multipart(), max_frame_bytes=self.max_frame_bytes)
        except FrameError as e:
            log.warning("dropped a malformed reply from the reward service: %s", e)
            return
        rid = msg.body.get("id") if isinstance(msg, Message) else None
        request = pending.get(rid) if isinstance(rid, str) else None
        if request is None:
            return  # a late reply to a request answered already (a resend's twin)
        assert isinstance(msg, Message) and isinstance(rid, str)
        if msg.kind == protocol.SCORES:
            try:
                results[rid] = protocol.parse_scores(msg.body, len(request.items))
            except ValueError as e:
                log.warning("a malformed reply from the reward service (%s): resending", e)
                return
        elif msg.kind == protocol.ERROR:
            reason = f"reward service: {msg.body.get('reason', 'no reason given')}"
            log.warning("%s (%d answers score 0)", reason, len(request.items))
            results[rid] = [(0.0, {"reward_error": reason})] * len(request.items)
        else:
            return
        del pending[rid]

    def _resend_overdue(self, pending: dict[str, _Request]) -> None:
        now = time.monotonic()
        for rid, request in pending.items():
            waited = now - request.sent_at
            if waited <= self.timeout_s:
                continue
            what = (
                f"the reward service at {self.addr} did not answer request {rid[:8]} "
                f"({len(request.items)} answers) within {self.timeout_s:g} s"
            )
            if request.tries > self.retries and self.on_failure == FAIL:
                raise RewardServiceError(
                    f"{what}, {request.tries} tries: is it running (ROLE=reward)? "
                    "reward.on_service_failure: wait keeps trying"
                )
            log.warning("%s: sending it again (try %d)", what, request.tries + 1)
            request.tries += 1
            self.resends += 1
            self._send(request)

    def close(self) -> None:
        if not self.ctx.closed:
            self.sock.close()
            self.ctx.term()


def combine(
    rule: Sequence[Scored], model: Sequence[Scored], rule_weight: float, model_weight: float
) -> list[Scored]:
    """rule_weight * rule + model_weight * model per answer; the info keeps both parts
    (`rule_reward`, `model_reward`) and both infos (the model's keys win a clash, except
    `reward_error`, which either part sets)."""
    out = []
    for (r, r_info), (m, m_info) in zip(rule, model, strict=True):
        info = {**r_info, **m_info, "rule_reward": r, "model_reward": m}
        errors = [e for e in (r_info.get("reward_error"), m_info.get("reward_error")) if e]
        if errors:
            info["reward_error"] = "; ".join(errors)
        out.append((rule_weight * r + model_weight * m, info))
    return out
