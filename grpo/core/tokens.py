"""The per-token fields of an episode, declared once: what each is, how it travels, who makes it
and what a receiver checks of it. The batch's columns and the episode's arrays
(grpo.core.columns, grpo.core.episode), the wire frames (grpo.wire.codec), the checks every
received batch goes through and the trainer's padded tensors (grpo.trainer.experience) are all
read from this table.

Adding a per-token field: its line here, its attribute on `Episode` and `Columns` (a test holds
them to this table), the role that produces it and the stage that reads it. Its frame comes after
every existing one, so batches without it keep their bytes (tests/test_wire_bytes.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPT, ANSWER = "prompt_len", "completion_len"  # the per-episode lengths a field follows


@dataclass(frozen=True)
class TokenField:
    name: str
    wire: str  # the wire dtype's name (grpo.core.columns.WIRE_DTYPES)
    follows: str  # PROMPT or ANSWER: which length of each episode it has
    optional: bool  # a batch may leave it out (None for the whole batch)
    kinds: str  # the numpy dtype kinds an episode's array may have (cast same-kind to `wire`)
    producer: str  # who fills it in
    bounded: bool = False  # a float within +-VALUE_LIMIT (log-probs)
    low: int | None = None  # an integer field's least value
    high: int | None = None  # and its greatest


# In frame order: never reorder (the wire bytes follow it).
TOKEN_FIELDS: tuple[TokenField, ...] = (
    TokenField("prompt_ids", "int32", PROMPT, False, "iu", "the sampler's tokenizer", low=0),
    TokenField("completion_ids", "int32", ANSWER, False, "iu", "the rollout engine", low=0),
    # under the sampling policy; left out when the trainer computes them (train.logprobs_on)
    TokenField("old_logp", "float32", ANSWER, True, "f", "sampler or trainer", bounded=True),
    # under the frozen reference, likewise
    TokenField("ref_logp", "float32", ANSWER, True, "f", "sampler or trainer", bounded=True),
    # as the rollout engine computed them; left out when the backend reports none
    TokenField("rollout_logp", "float32", ANSWER, True, "f", "the rollout engine", bounded=True),
    # 1 on the tokens the model sampled, 0 on a tool's results; left out for single-turn
    # answers (every token the model's), so that their frames are what they were before tools
    TokenField("loss_mask", "uint8", ANSWER, True, "bu", "the tools (multi-turn)", low=0, high=1),
    # under the teacher (on-policy distillation); left out when the run has no teacher
    TokenField("teacher_logp", "float32", ANSWER, True, "f", "the teacher", bounded=True),
    # the weights version that sampled each token (continuous generation); left out when all
    # of a batch's tokens are of its policy_version (lock-step sampling)
    TokenField("token_versions", "int32", ANSWER, True, "iu", "continuous generation", low=0),
)
OPTIONAL = tuple(f.name for f in TOKEN_FIELDS if f.optional)
