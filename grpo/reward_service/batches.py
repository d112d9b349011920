"""Answering the requests a reward service gathered in one call: the reward backend's scores
for SCORE requests, the teacher's log-probs for TEACHER requests. Both answer the same way
(`answer`): one batched call for all of them; if it fails, each request again on its own, so
that one the call cannot take (too long, malformed, another temperature) fails alone, not the
other samplers' requests gathered with it; then each request its share of the results.
"""

from __future__ import annotations

import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from grpo.reward_service import protocol
from grpo.reward_service.backends import RewardBackend, ServedTeacher
from grpo.reward_service.protocol import Item, TeacherRequest
from grpo.wire.codec import Message

log = logging.getLogger("grpo.reward")


@dataclass
class Request:
    peer: bytes  # the ROUTER identity to answer
    rid: str
    items: list[Item]  # SCORE: the answers to score
    teacher: TeacherRequest | None = None  # TEACHER: the answers to score with the teacher

    @property
    def size(self) -> int:
        return len(self.teacher.completions) if self.teacher is not None else len(self.items)


@dataclass
class Counters:
    requests: int = 0
    answers: int = 0  # items scored
    backend_calls: int = 0
    repeats: int = 0  # resends answered from the cache or dropped as in flight
    refused: int = 0  # malformed frames and requests
    failures: int = 0  # backend calls that raised
    seconds: float = 0.0  # in the backend and the teacher
    teacher_answers: int = 0  # answers whose tokens the teacher scored
    teacher_calls: int = 0


class Split(Exception):
    """Requests gathered together that one call cannot take: each is answered alone."""


class Replier(Protocol):
    """What `answer` needs of the service: its counters and its two ways of replying."""

    counters: Counters

    def send_each(
        self,
        pending: list[Request],
        results: list,
        what: str,
        reply: Callable[[Request, list], Message],
    ) -> None: ...

    def answer_error(self, peer: bytes, rid: str, reason: str) -> None: ...


class Job(ABC):
    """One kind of request, answered for all the gathered ones in one call."""

    who: str  # who answers, for the log and the error a sampler reads
    what: str  # what a reply carries

    @abstractmethod
    def call(self, pending: list[Request]) -> list:
        """One result per answer of `pending`, in order; raises to fail the call (Split: no
        failure, each request answered alone)."""

    @abstractmethod
    def reply(self, request: Request, results: list) -> Message:
        """The reply to `request`, its share of the results."""

    @abstractmethod
    def count(self, counters: Counters, answers: int) -> None:
        """Count one successful call of `answers` answers."""


def answer(service: Replier, job: Job, pending: list[Request]) -> None:
    """Answer `pending` with `job` in one call; if it fails, each request again alone."""
    t0, answers = time.monotonic(), sum(r.size for r in pending)
    try:
        results = job.call(pending)
        if len(results) != answers:
            raise RuntimeError(f"{job.who} gave {len(results)} results for {answers} answers")
    except Exception as e:
        if not isinstance(e, Split):
            service.counters.failures += 1
            log.exception("%s failed on %d answers", job.who, answers)
        if len(pending) > 1:
            for r in pending:
                answer(service, job, [r])
        else:
            reason = f"{job.who} failed: {type(e).__name__}: {e}"
            service.answer_error(pending[0].peer, pending[0].rid, reason)
        return
    service.counters.seconds += time.monotonic() - t0
    job.count(service.counters, answers)
    service.send_each(pending, results, job.what, job.reply)


class Scoring(Job):
    who, what = "the reward backend", "scores"

    def __init__(self, backend: RewardBackend):
        self.backend = backend

    def call(self, pending: list[Request]) -> list:
        return self.backend.score([item for r in pending for item in r.items])

    def reply(self, request: Request, results: list) -> Message:
        return Message(protocol.SCORES, scores_body(request.rid, results))

    def count(self, counters: Counters, answers: int) -> None:
        counters.backend_calls += 1
        counters.answers += answers


class Teaching(Job):
    who, what = "the teacher", "log-probs"

    def __init__(self, teacher: ServedTeacher):
        self.teacher = teacher

    def call(self, pending: list[Request]) -> list:
        asked = [r.teacher for r in pending if r.teacher is not None]
        temperatures = {t.temperature for t in asked}
        if len(temperatures) > 1:  # one forward per temperature
            raise Split()
        prompts = [p for t in asked for p in t.prompts]
        completions = [c for t in asked for c in t.completions]
        logps = self.teacher.logprobs(prompts, completions, temperatures.pop())
        if [len(x) for x in logps] != [len(c) for c in completions]:
            raise RuntimeError("the teacher gave log-probs of other lengths than the answers")
        return logps

    def reply(self, request: Request, results: list) -> Message:
        return Message(protocol.TEACHER_LOGP, protocol.teacher_reply_body(request.rid, results))

    def count(self, counters: Counters, answers: int) -> None:
        counters.teacher_calls += 1
        counters.teacher_answers += answers


def scores_body(rid: str, scored: list[tuple[float, dict]]) -> dict:
    """A SCORES body. A non-finite score scores 0 with a reward_error: the sampler refuses a
    NaN, and training on one would end the run."""
    rewards, infos = [], []
    for value, info in scored:
        value = float(value)
        if not math.isfinite(value):
            value, info = (
                0.0,
                {"reward_error": f"reward service: the backend gave a non-finite score ({value})"},
            )
        rewards.append(value)
        infos.append(info)
    return {"id": rid, "rewards": rewards, "infos": infos}
