"""The reward service's messages, in the project's framing (grpo.wire.codec: msgpack, checksum).

Sampler (DEALER) -> service (ROUTER):
    SCORE   {"id": str, "items": [{"prompt": str, "answer": str, "reference": str}, ...]}
    PING    {}
Service -> sampler:
    SCORES  {"id": str, "rewards": [float, ...], "infos": [{str: scalar}, ...]}
    ERROR   {"id": str, "reason": str}: the request cannot be scored (malformed, too big)
    PONG    {"backend": str}

A request id names one request for good: a resend after a timeout carries the same id, and the
service answers a repeat from its cache instead of scoring again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo.core.columns import VALUE_LIMIT, is_finite_real

SCORE, SCORES, ERROR, PING, PONG = "score", "scores", "error", "ping", "pong"
ITEM_FIELDS = ("prompt", "answer", "reference")


@dataclass(frozen=True)
class Item:
    """One answer to score: the question as the model saw it, the answer, and the dataset's
    reference answer ('' when there is none)."""

    prompt: str
    answer: str
    reference: str = ""

    def to_json(self) -> dict[str, str]:
        return dict(zip(ITEM_FIELDS, (self.prompt, self.answer, self.reference), strict=True))


def parse_request(body: dict[str, Any], max_items: int) -> tuple[str, list[Item]]:
    """(id, items) of a SCORE body; ValueError naming what is wrong."""
    rid, items = body.get("id"), body.get("items")
    if not isinstance(rid, str) or not rid:
        raise ValueError("a score request needs a non-empty str id")
    if not isinstance(items, list) or not items:
        raise ValueError(f"request {rid}: items must be a non-empty list")
    if len(items) > max_items:
        raise ValueError(f"request {rid}: {len(items)} items, over the service's {max_items}")
    out = []
    for i, item in enumerate(items):
        values = [item.get(k) for k in ITEM_FIELDS] if isinstance(item, dict) else []
        if len(values) != len(ITEM_FIELDS) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"request {rid}: item {i} needs str prompt, answer and reference")
        out.append(Item(*values))
    return rid, out


def parse_scores(body: dict[str, Any], n: int) -> list[tuple[float, dict[str, Any]]]:
    """The (reward, info) pairs of a SCORES body for a request of `n` items."""
    rewards, infos = body.get("rewards"), body.get("infos")
    if not (isinstance(rewards, list) and isinstance(infos, list)):
        raise ValueError("a scores reply needs rewards and infos lists")
    if len(rewards) != n or len(infos) != n:
        raise ValueError(f"a scores reply has {len(rewards)} rewards for {n} items")
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards):
        raise ValueError("a scores reply has a reward that is not a number")
    if not all(isinstance(i, dict) for i in infos):
        raise ValueError("a scores reply has an info that is not a map")
    return [_checked(r, i) for r, i in zip(rewards, infos, strict=True)]


def _checked(reward: float, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One score as the service sent it, or, if it is not a number the trainer can train on,
    0 with a reward_error (as an ERROR reply scores): refused here, where it enters, and only
    this answer's, so the rest of the reply counts and a cached reply is not asked for again."""
    if is_finite_real(reward) and abs(reward) <= VALUE_LIMIT:
        return float(reward), info
    why = f"reward service: score {reward!r:.40} is not a finite number within +-{VALUE_LIMIT:g}"
    return 0.0, {**info, "reward_error": why}
