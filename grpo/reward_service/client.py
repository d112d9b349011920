"""The sampler's end of the reward service, and the run's reward when it uses one.

`RewardClient.score` sends the answers in requests of `reward.service_batch`, all at once, and
waits for their replies, each with `reward.service_timeout_s`. A request without a reply is
sent again with the same id (the service answers a repeat from its cache, so nothing is scored
twice) up to `reward.service_retries` times; then, with `reward.on_service_failure: fail`, the
sampler stops with a line naming the service; with `wait`, it keeps resending, saying so,
until the service is back. An ERROR reply scores its answers 0 with the reason as
`reward_error`, as a failing rule reward does.

`RewardClient.teacher_logprobs` (teacher.where: service, through `RemoteTeacher`) asks the
service's teacher for per-token log-probs on the same terms; a reply it cannot take (an error,
wrong lengths, a value not finite) is refused, counted and resent, since an answer has no
stand-in for its teacher's log-probs.

`combine` is the run's reward: the weighted sum of the task's rule reward and the service's,
each kept in the reward info.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from grpo.core.columns import is_finite_real
from grpo.core.episode import REWARD_COMPONENT_PREFIX
from grpo.models.embedded import ModelError
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
    size: int  # answers it holds
    frames: list[bytes]
    sent_at: float
    tries: int = 1
    refused: str = ""  # why the last reply to it was not taken (it is then resent)


class RewardClient:
    """One sampler's DEALER socket to the service: scores (`score`) and, with teacher.where:
    service, the teacher's log-probs (`teacher_logprobs`, used through RemoteTeacher), each
    request resent on the same terms."""

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
        self.refused = 0  # replies not taken: malformed, or a teacher request's error

    def score(self, items: Sequence[Item]) -> list[Scored]:
        """(reward, info) per item, in order: every item scored once."""

        def parse(msg: Message, n: int) -> list[Scored]:
            if msg.kind == protocol.SCORES:
                return protocol.parse_scores(msg.body, n)  # ValueError: malformed, resent
            reason = f"reward service: {msg.body.get('reason', 'no reason given')}"
            log.warning("%s (%d answers score 0)", reason, n)
            return [(0.0, {"reward_error": reason})] * n

        bodies = [
            (
                protocol.SCORE,
                {
                    "id": uuid.uuid4().hex,
                    "items": [it.to_json() for it in items[s : s + self.batch]],
                },
            )
            for s in range(0, len(items), self.batch)
        ]
        return self._exchange(
            bodies, [len(b["items"]) for _, b in bodies], (protocol.SCORES, protocol.ERROR), parse
        )

    def teacher_logprobs(
        self,
        prompts: Sequence[np.ndarray],
        completions: Sequence[np.ndarray],
        temperature: float,
        tokenizer: dict[str, Any],
    ) -> list[np.ndarray]:
        """The service's teacher's log-probs of each completion's tokens, in order; requests of
        `batch` answers. A reply that is malformed (lengths, dtype, a value not finite within
        VALUE_LIMIT) or an ERROR is refused, counted (`refused`) and the request resent, as an
        unanswered one is; a tokenizer the teacher does not share stops the sampler
        (ModelError, one line)."""

        def parse(msg: Message, n: int, lengths: list[int]) -> list[np.ndarray]:
            if msg.kind == protocol.TEACHER_LOGP:
                return protocol.parse_teacher_reply(msg.body, lengths)
            reason = str(msg.body.get("reason", "no reason given"))[:500]
            if msg.body.get("code") == protocol.TOKENIZER_MISMATCH:
                raise ModelError(f"the reward service at {self.addr}: {reason}")
            raise ValueError(f"it answered an error: {reason}")

        bodies, lengths = [], []
        for s in range(0, len(completions), self.batch):
            chunk = completions[s : s + self.batch]
            rid = uuid.uuid4().hex
            bodies.append(
                (
                    protocol.TEACHER,
                    protocol.teacher_body(
                        rid, prompts[s : s + self.batch], chunk, temperature, tokenizer
                    ),
                )
            )
            lengths.append([len(c) for c in chunk])
        by_size = dict(zip((b["id"] for _, b in bodies), lengths, strict=True))
        return self._exchange(
            bodies,
            [len(x) for x in lengths],
            (protocol.TEACHER_LOGP, protocol.ERROR),
            lambda msg, n: parse(msg, n, by_size[msg.body["id"]]),
        )

    def _exchange(
        self,
        bodies: list[tuple[str, dict[str, Any]]],
        sizes: list[int],
        kinds: tuple[str, ...],
        parse: Callable[[Message, int], list],
    ) -> list:
        """Send the requests all at once and wait for their replies: what `parse` makes of
        each (a list per request, of its size), in request order. `parse` raising ValueError
        refuses that reply: counted, logged, and the request resent after its timeout."""
        pending: dict[str, _Request] = {}
        for (kind, body), size in zip(bodies, sizes, strict=True):
            pending[body["id"]] = _Request(size, encode_message(Message(kind, body)), 0.0)
        order = list(pending)
        results: dict[str, list] = {}
        for request in pending.values():
            self._send(request)
        # Waiting on a peer, not working: its silence is judged by service_timeout_s, not by
        # the stall check (grpo.runtime.progress).
        with ACTIVITY.during(WAITING, f"for the reward service at {self.addr}"):
            while pending:
                if self.stop_event.is_set():
                    raise PeerError("stopped while waiting for the reward service")
                if self.sock.poll(timeout=200):
                    self._receive(pending, results, kinds, parse)
                self._resend_overdue(pending)
        return [out for rid in order for out in results[rid]]

    def _send(self, request: _Request) -> None:
        request.sent_at = time.monotonic()
        self.sock.send_multipart(request.frames)

    def _receive(
        self,
        pending: dict[str, _Request],
        results: dict[str, list],
        kinds: tuple[str, ...],
        parse: Callable[[Message, int], list],
    ) -> None:
        try:
            msg = decode(self.sock.recv_multipart(), max_frame_bytes=self.max_frame_bytes)
        except FrameError as e:
            self.refused += 1
            log.warning("dropped a malformed reply from the reward service: %s", e)
            return
        rid = msg.body.get("id") if isinstance(msg, Message) else None
        request = pending.get(rid) if isinstance(rid, str) else None
        if request is None:
            return  # a late reply to a request answered already (a resend's twin)
        assert isinstance(msg, Message) and isinstance(rid, str)
        if msg.kind not in kinds:
            return
        try:
            results[rid] = parse(msg, request.size)
        except ValueError as e:
            if isinstance(e, ModelError):
                raise
            self.refused += 1
            request.refused = str(e)[:500]
            log.warning(
                "refused a reply from the reward service to request %s (%d refused so "
                "far): %s; it is sent again after %g s",
                rid[:8],
                self.refused,
                request.refused,
                self.timeout_s,
            )
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
                f"({request.size} answers) within {self.timeout_s:g} s"
            )
            if request.refused:
                what += f" (the last reply was refused: {request.refused})"
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


class RemoteTeacher:
    """teacher.where: service: the reward service's teacher, as a TeacherScorer
    (grpo.scoring.teacher) through the sampler's RewardClient for it."""

    def __init__(self, client: RewardClient, tokenizer: dict[str, Any]):
        self.client, self.tokenizer = client, tokenizer

    def logprobs(
        self, prompts: Sequence[np.ndarray], completions: Sequence[np.ndarray], temperature: float
    ) -> list[np.ndarray]:
        return self.client.teacher_logprobs(prompts, completions, temperature, self.tokenizer)


def combine(
    rule: Sequence[Scored], model: Sequence[Scored], rule_weight: float, model_weight: float
) -> list[Scored]:
    """rule_weight * rule + model_weight * model per answer; the info keeps both parts
    (`rule_reward`, `model_reward`) and both infos (the model's keys win a clash, except
    `reward_error`, which either part sets). GDPO's components (`reward/<name>`) still sum to
    the reward: the rule's scaled by rule_weight, and the model's score one of its own,
    `reward/model` (so a judge is normalised apart from format and answer)."""
    out = []
    for (r, r_info), (m, m_info) in zip(rule, model, strict=True):
        info = {**r_info, **m_info, "rule_reward": r, "model_reward": m}
        for key, value in r_info.items():
            if key.startswith(REWARD_COMPONENT_PREFIX) and is_finite_real(value):
                info[key] = rule_weight * float(value)
        info[f"{REWARD_COMPONENT_PREFIX}model"] = model_weight * m
        errors = [e for e in (r_info.get("reward_error"), m_info.get("reward_error")) if e]
        if errors:
            info["reward_error"] = "; ".join(errors)
        out.append((rule_weight * r + model_weight * m, info))
    return out
