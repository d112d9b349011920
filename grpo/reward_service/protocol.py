"""The reward service's messages, in the project's framing (grpo.wire.codec: msgpack, checksum).

Sampler (DEALER) -> service (ROUTER):
    SCORE   {"id": str, "items": [{"prompt": str, "answer": str, "reference": str}, ...]}
    TEACHER {"id": str, "temperature": float, "tokenizer": {...},
             "prompt_len", "completion_len", "prompt_ids", "completion_ids": int32 arrays}
    PING    {}
Service -> sampler:
    SCORES  {"id": str, "rewards": [float, ...], "infos": [{str: scalar}, ...]}
    TEACHER_LOGP {"id": str, "logp": float32 array}: the teacher's log-prob of every completion
            token, the completions end to end (their lengths are the request's)
    ERROR   {"id": str, "reason": str}: the request cannot be scored (malformed, too big); a
            TEACHER request whose tokenizer is not the teacher's has "code": "tokenizer"
    PONG    {"backend": str, "teacher": bool}

An array travels as {"dtype": "int32" | "float32", "data": raw little-endian bytes} (msgpack
bin, as the weight chunks' bytes do): no list of numbers, and its dtype and byte count are
checked against what the message needs before a view of it is made.

A request id names one request for good: a resend after a timeout carries the same id, and the
service answers a repeat from its cache instead of scoring again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo.core.columns import VALUE_LIMIT, WIRE_DTYPES, check_bounded, is_finite_real

SCORE, SCORES, ERROR, PING, PONG = "score", "scores", "error", "ping", "pong"
TEACHER, TEACHER_LOGP = "teacher", "teacher_logp"
TOKENIZER_MISMATCH = "tokenizer"  # an ERROR's code: the sampler stops, it is no passing failure
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


# --------------------------------------------------------------------------- teacher log-probs


@dataclass(frozen=True)
class TeacherRequest:
    """Answers whose tokens the teacher scores: prompt and completion ids (int32) per answer,
    at `temperature`, from a sampler whose tokenizer is described by `tokenizer`."""

    prompts: list[np.ndarray]
    completions: list[np.ndarray]
    temperature: float
    tokenizer: dict[str, Any]


def pack_array(values: np.ndarray, dtype: str) -> dict[str, Any]:
    """An array as a message carries it: its dtype's name and its little-endian bytes."""
    return {"dtype": dtype, "data": np.ascontiguousarray(values, WIRE_DTYPES[dtype]).tobytes()}


def unpack_array(value: Any, dtype: str, what: str, count: int | None = None) -> np.ndarray:
    """The array `value` carries, read-only; ValueError unless it is a {dtype, data} map of
    `dtype` (of `count` values when given)."""
    if not isinstance(value, dict) or set(value) != {"dtype", "data"}:
        raise ValueError(f"{what} must be a map of dtype and data")
    if value["dtype"] != dtype:
        raise ValueError(f"{what} has dtype {value['dtype']!r:.40}, expected {dtype}")
    data, size = value["data"], WIRE_DTYPES[dtype].itemsize
    if not isinstance(data, bytes) or len(data) % size:
        raise ValueError(f"{what} must be bytes holding whole {dtype} values")
    if count is not None and len(data) != count * size:
        raise ValueError(f"{what} holds {len(data) // size} values, expected {count}")
    return np.frombuffer(data, dtype=WIRE_DTYPES[dtype])


def teacher_body(
    rid: str,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    temperature: float,
    tokenizer: dict[str, Any],
) -> dict[str, Any]:
    """A TEACHER request's body."""
    lens = [np.array([len(a) for a in arrays], np.int64) for arrays in (prompts, completions)]
    joined = [
        np.concatenate([np.asarray(a) for a in arrays]) if len(arrays) else np.zeros(0)
        for arrays in (prompts, completions)
    ]
    return {
        "id": rid, "temperature": float(temperature), "tokenizer": tokenizer,
        "prompt_len": pack_array(lens[0], "int32"), "completion_len": pack_array(lens[1], "int32"),
        "prompt_ids": pack_array(joined[0], "int32"),
        "completion_ids": pack_array(joined[1], "int32"),
    }  # fmt: skip


TEACHER_FIELDS = frozenset(
    {
        "id",
        "temperature",
        "tokenizer",
        "prompt_len",
        "completion_len",
        "prompt_ids",
        "completion_ids",
    }
)


def parse_teacher_request(
    body: dict[str, Any], max_items: int, max_tokens: int, vocab_size: int
) -> tuple[str, TeacherRequest]:
    """(id, request) of a TEACHER body; ValueError naming what is wrong: a field missing or of
    the wrong type or dtype, lengths that do not add up to the ids, an answer with no prompt
    token or longer than `max_tokens`, an id outside the teacher's `vocab_size` rows."""
    rid = body.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError("a teacher request needs a non-empty str id")
    if set(body) != TEACHER_FIELDS:
        missing, extra = sorted(TEACHER_FIELDS - set(body)), sorted(set(body) - TEACHER_FIELDS)
        raise ValueError(f"request {rid}: missing fields {missing}, unexpected {extra}"[:300])
    temperature = body["temperature"]
    if not (is_finite_real(temperature) and 0 < temperature <= 100):
        raise ValueError(f"request {rid}: temperature {temperature!r:.40} is not in (0, 100]")
    if not isinstance(body["tokenizer"], dict):
        raise ValueError(f"request {rid}: tokenizer must be a map")
    p_len = unpack_array(body["prompt_len"], "int32", f"request {rid}: prompt_len")
    c_len = unpack_array(
        body["completion_len"], "int32", f"request {rid}: completion_len", count=len(p_len)
    )
    n = len(p_len)
    if not 1 <= n <= max_items:
        raise ValueError(f"request {rid}: {n} answers, not in 1..{max_items}")
    if int(p_len.min()) < 1 or int(c_len.min()) < 0:
        raise ValueError(f"request {rid}: an answer has no prompt token or a negative length")
    total = p_len.astype(np.int64) + c_len
    if int(total.max()) > max_tokens:
        i = int(total.argmax())
        raise ValueError(
            f"request {rid}: answer {i} is {int(total[i])} tokens, over the "
            f"teacher's {max_tokens} (teacher.max_tokens)"
        )
    ids = [
        unpack_array(body[key], "int32", f"request {rid}: {key}", count=int(lens.sum()))
        for key, lens in (("prompt_ids", p_len), ("completion_ids", c_len))
    ]
    for key, arr in zip(("prompt_ids", "completion_ids"), ids, strict=True):
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= vocab_size):
            bad = int(arr[(arr < 0) | (arr >= vocab_size)][0])
            raise ValueError(
                f"request {rid}: {key} holds {bad}, outside the teacher's "
                f"vocabulary of {vocab_size}"
            )
    # Copies, writable (torch warns of a read-only view of the frame), one per side.
    prompts = np.split(ids[0].copy(), np.cumsum(p_len)[:-1])
    completions = np.split(ids[1].copy(), np.cumsum(c_len)[:-1])
    return rid, TeacherRequest(prompts, completions, float(temperature), body["tokenizer"])


def teacher_reply_body(rid: str, logps: Sequence[np.ndarray]) -> dict[str, Any]:
    """A TEACHER_LOGP body; ValueError (that request's failure) unless every log-prob is a
    finite number within VALUE_LIMIT, as the sampler will check."""
    joined = np.concatenate([np.asarray(x, np.float32) for x in logps]) if logps else []
    check_bounded(np.asarray(joined, np.float32), "the teacher's log-probs")
    return {"id": rid, "logp": pack_array(np.asarray(joined), "float32")}


def parse_teacher_reply(body: dict[str, Any], lengths: Sequence[int]) -> list[np.ndarray]:
    """The teacher's log-probs of each completion of a request whose completions have
    `lengths`; ValueError unless the reply holds exactly that many float32 values, each finite
    and within +-VALUE_LIMIT."""
    if set(body) != {"id", "logp"}:
        raise ValueError("a teacher reply needs exactly an id and logp")
    logp = unpack_array(body["logp"], "float32", "the teacher's logp", count=int(sum(lengths)))
    check_bounded(logp, "the teacher's logp")
    return [a.copy() for a in np.split(logp, np.cumsum(lengths)[:-1])] if lengths else []
