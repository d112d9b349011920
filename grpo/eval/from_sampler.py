"""eval.engine: sampler: the sampler's engine generates a version's evaluation answers, and the
trainer scores them. On the wire go the answers' token ids and finish reasons only: what is
right, formatted or degenerate the trainer decides with its own reward, on its own copy of the
questions, so a sampler can make an evaluation slow or wrong only by answering badly, never by
saying what its answers were worth. `answers_from_wire` checks every field against what the
trainer expects (one entry per question it asked, the spec's number of sampled answers, token
ids in the vocabulary, no answer longer than eval.max_new_tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from grpo.eval.questions import Answered, EvalSpec
from grpo.rollout.base import Generation
from grpo.tasks.encoding import Prompt

FINISH_REASONS = ("stop", "length")
IDS_DTYPE = np.dtype("<i4")  # token ids on the wire: little-endian int32 bytes, one per answer


def answers_to_wire(answered: Sequence[Answered]) -> dict[str, list]:
    """The answers as four flat lists (the greedy ones, then every question's sampled ones in
    question order), each answer's ids as bytes: msgpack-able within the wire's bounds on
    nested containers (grpo.wire.unpack)."""
    sampled = [g for a in answered for g in a.sampled]
    return {
        "greedy": [_ids(a.greedy) for a in answered],
        "greedy_finish": [a.greedy.finish_reason for a in answered],
        "sampled": [_ids(g) for g in sampled],
        "sampled_finish": [g.finish_reason for g in sampled],
    }


def _ids(g: Generation) -> bytes:
    return np.asarray(g.completion_ids).astype(IDS_DTYPE).tobytes()


def answers_from_wire(
    data: Any, prompts: Sequence[Prompt], spec: EvalSpec, vocab_size: int
) -> list[Answered]:
    """The answers a sampler sent to `prompts`, in order; ValueError naming the first field
    that is not what this trainer asked for."""
    if not isinstance(data, dict):
        raise ValueError(f"answers are a {type(data).__name__}, not a map")
    n, k = len(prompts), spec.samples
    greedy = _generations(data, "greedy", n, spec, vocab_size)
    sampled = _generations(data, "sampled", n * k, spec, vocab_size)
    out = []
    for i, prompt in enumerate(prompts):
        prompt_ids = np.asarray(prompt.ids, np.int32)
        g, *others = (
            replace(x, prompt_ids=prompt_ids) for x in (greedy[i], *sampled[i * k : (i + 1) * k])
        )
        out.append(Answered(g, tuple(others)))
    return out


def _generations(
    data: dict, key: str, count: int, spec: EvalSpec, vocab_size: int
) -> list[Generation]:
    ids, finish = data.get(key), data.get(f"{key}_finish")
    if not (isinstance(ids, list) and isinstance(finish, list)):
        raise ValueError(f"{key} answers: no lists of token ids and finish reasons")
    if len(ids) != count or len(finish) != count:
        raise ValueError(f"{len(ids)} {key} answers, {len(finish)} finish reasons, not {count}")
    limit, out = spec.greedy.max_new_tokens, []
    empty = np.zeros(0, np.int32)
    for i, (raw, why) in enumerate(zip(ids, finish, strict=True)):
        if why not in FINISH_REASONS:
            raise ValueError(f"{key} answer {i}: finish reason {str(why)[:40]!r}")
        if not isinstance(raw, bytes) or len(raw) % IDS_DTYPE.itemsize:
            raise ValueError(f"{key} answer {i}: token ids are not int32 bytes")
        tokens = np.frombuffer(raw, IDS_DTYPE).astype(np.int32)
        if len(tokens) > limit:
            raise ValueError(f"{key} answer {i}: {len(tokens)} tokens, over {limit}")
        if len(tokens) and not (tokens.min() >= 0 and tokens.max() < vocab_size):
            raise ValueError(
                f"{key} answer {i}: a token id outside the vocabulary [0, {vocab_size})"
            )
        out.append(Generation(empty, tokens, why))
    return out
