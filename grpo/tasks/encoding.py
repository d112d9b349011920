"""A row's prompt as the policy reads it: the task's chat messages through the tokenizer's chat
template, as tokens. The sampler's batches and the trainer's evaluation encode prompts alike,
from here."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .base import Row, Task

log = logging.getLogger("grpo.tasks")


@dataclass(frozen=True)
class Prompt:
    index: int  # row index in the dataset: the group id
    row: Row
    ids: np.ndarray  # int32 chat-templated prompt tokens
    position: int = 0  # where in the shard's order it was drawn (Shard.prompt_at)


# No token of a real tokenizer spans this many characters on average over a prompt, so a prompt
# text longer than this many characters a token of data.max_prompt_tokens cannot fit, and is
# refused without tokenizing it (~2 us a character: one huge row would stall the sampler).
MAX_CHARS_PER_TOKEN = 64


def encode_prompt(
    task: Task, row: Row, tokenizer, system_prompt: str, max_tokens: int | None = None
) -> np.ndarray | None:
    """The chat-templated prompt tokens of one row; None when they cannot fit `max_tokens`
    (a text longer than MAX_CHARS_PER_TOKEN characters a token is not tokenized at all)."""
    text = tokenizer.apply_chat_template(
        task.build_messages(row, system_prompt), add_generation_prompt=True, tokenize=False
    )
    if max_tokens is not None and len(text) > max_tokens * MAX_CHARS_PER_TOKEN:
        return None
    ids = np.asarray(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int32)
    return ids if max_tokens is None or len(ids) <= max_tokens else None


def encode_prompts(
    task: Task, rows: list[Row], tokenizer, system_prompt: str, max_tokens: int
) -> list[Prompt]:
    """Chat-template every row; rows whose prompt exceeds `max_tokens` are skipped (logged)."""
    prompts = []
    for i, row in enumerate(rows):
        ids = encode_prompt(task, row, tokenizer, system_prompt, max_tokens)
        if ids is not None:
            prompts.append(Prompt(i, row, ids))
    if len(prompts) < len(rows):
        log.warning(
            "skipped %d prompts longer than %d tokens", len(rows) - len(prompts), max_tokens
        )
    if not prompts:
        raise ValueError(f"no prompt fits data.max_prompt_tokens={max_tokens}")
    return prompts
