"""The model forward over (prompt, completion) pairs: padded (prompts left-padded, completions
right-padded) or packed (every pair end to end in one row), cut to the positions that predict
completion tokens (:func:`completion_outputs`). The policy's log-probs and the critic's values
(grpo.trainer.critic) are both read from it, laid out (rows, completion length)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from grpo.core.batching import PackedPairs, pack_pairs, pad_pairs
from grpo.scoring.kernels import (
    Truncation,
    kept_log_mass,
    token_entropy_with_grad,
    token_logprobs,
    token_logprobs_and_entropy,
)


def completion_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_len: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the completion tokens under a causal LM: -> (B, L - prompt_len) twice.

    Layout (what HF generate produces): prompts LEFT-padded to a common `prompt_len`, then
    the completions RIGHT-padded, so completion token j of every row sits at column
    prompt_len + j. input_ids / attention_mask: (B, L).

    position_ids = cumsum(attention_mask) - 1 (clamped at 0), so a left-padded row sees the
    same positions as the same row without padding; pad positions are masked out anyway.
    The logits are divided by `temperature` so the log-probs are those of the distribution
    the sampler actually drew from (importance ratios and KL are then consistent with it).

    `entropy_grad` makes the entropy differentiable (for an entropy bonus in the loss).
    Returns (logp, entropy or None), float32. Positions that are padding (attention_mask 0
    in the completion part) hold arbitrary finite values: callers mask them.
    """
    logits, labels = _completion_logits(
        model, input_ids, attention_mask, prompt_len, skip_prompt_logits=True
    )
    return _logprobs_and_entropy(
        logits, labels, temperature, with_entropy, entropy_grad, chunk_size
    )


def _completion_logits(
    model, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, skip_prompt_logits: bool
) -> tuple[Tensor, Tensor]:
    """The logits that predict the completion tokens, (B, C, V), and those tokens, (B, C)."""
    B, L = input_ids.shape
    if not 1 <= prompt_len < L:
        raise ValueError(f"need 1 <= prompt_len < L, got prompt_len={prompt_len}, L={L}")
    n_keep = L - prompt_len + 1  # logits at prompt_len-1 .. L-1; the last one predicts nothing
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        # Only project the completion part through the LM head (skips the prompt's logits).
        **({"logits_to_keep": n_keep} if skip_prompt_logits else {}),
    )
    # Slicing from the end works whether the model honoured logits_to_keep or returned all L.
    logits = out.logits[:, -n_keep:-1]  # (B, L - prompt_len, V), predicts input_ids[:, prompt_len:]
    labels = input_ids[:, prompt_len:]  # (B, L - prompt_len)
    return logits, labels


def _logprobs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor | None]:
    args = dict(temperature=temperature, chunk_size=chunk_size)
    if not with_entropy:
        return token_logprobs(logits, labels, **args), None
    if entropy_grad:
        return token_logprobs(logits, labels, **args), token_entropy_with_grad(logits, **args)
    return token_logprobs_and_entropy(logits, labels, **args)


def packed_completion_logprobs(
    model,
    packed: PackedPairs,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """:func:`completion_logprobs` of pairs packed into one row: the same (B, C) outputs,
    without computing a single padding token.

    Only the logits that predict completion tokens go through the LM head
    (``logits_to_keep`` given as indices), then the per-token results are scattered
    back to the padded (B, C) layout the losses use.
    """
    logits, labels = _packed_logits(model, packed, skip_prompt_logits=True)
    logp, entropy = _logprobs_and_entropy(
        logits, labels, temperature, with_entropy, entropy_grad, chunk_size
    )
    return packed.unpack(logp), None if entropy is None else packed.unpack(entropy)


def _packed_logits(model, packed: PackedPairs, skip_prompt_logits: bool) -> tuple[Tensor, Tensor]:
    """The logits that predict the packed completion tokens, (1, K, V), and those tokens."""
    device = device_of(model)
    index = packed.logit_index.to(device)
    out = model(
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        use_cache=False,
        **({"logits_to_keep": index} if skip_prompt_logits else {}),
    )
    logits = out.logits  # (1, K, V)
    if logits.shape[1] != index.numel():
        logits = logits[:, index]  # a model not given or ignoring logits_to_keep: all S positions
    return logits, packed.labels.to(device)[None]


def device_of(model) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


class CompletionOutputs(NamedTuple):
    """What :func:`completion_outputs` returns: the model's outputs at the positions that predict
    a completion token, in the forward's own layout, and how to lay them out (B, C)."""

    logits: Tensor  # (B, C, V) padded or (1, K, V) packed; V = 1 for the critic's value head
    labels: Tensor  # (B, C) or (1, K): the completion token each of those positions predicts
    mask: Tensor  # (B, C) float on the CPU, 1.0 on real completion tokens
    to_rows: Callable[[Tensor], Tensor]  # a per-position result of this layout -> (B, C)


def completion_outputs(
    model,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    *,
    packed: bool,
    pad_id: int,
    skip_prompt_logits: bool = True,
) -> CompletionOutputs:
    """One forward of `model` over the (prompt, completion) pairs, cut to the positions that
    predict the completion tokens; the policy turns these logits into log-probs, the critic
    (a one-label token classifier) reads them as values.

    `packed` puts the pairs back to back in one row instead of padding them to a rectangle;
    both give the same numbers. `skip_prompt_logits` passes transformers' `logits_to_keep`, so
    a causal LM's head computes no logits for the prompts; the critic's token classifier takes
    no such argument (it goes on to its base model) and computes every position's value.
    """
    if packed:
        pairs = pack_pairs(prompts, completions)
        logits, labels = _packed_logits(model, pairs, skip_prompt_logits)
        return CompletionOutputs(logits, labels, pairs.response_mask, pairs.unpack)
    padded = pad_pairs(prompts, completions, pad_id)
    device = device_of(model)
    logits, labels = _completion_logits(
        model,
        padded.input_ids.to(device),
        padded.attention_mask.to(device),
        padded.prompt_len,
        skip_prompt_logits,
    )
    return CompletionOutputs(logits, labels, padded.response_mask, _already_rows)


def _already_rows(t: Tensor) -> Tensor:
    """The padded layout's per-position results are (B, C) already."""
    return t


class PairsLogprobs(NamedTuple):
    """What :func:`pairs_logprobs` returns, all (B, C) on the model's device."""

    logp: Tensor  # log-probs of the completion tokens (differentiable)
    entropy: Tensor | None  # when asked for
    mask: Tensor  # float, 1.0 on real completion tokens
    log_kept_mass: Tensor | None  # when a truncation was given; see kept_log_mass


def pairs_logprobs(
    model,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    *,
    packed: bool,
    pad_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    truncation: Truncation | None = None,
    chunk_size: int = 1024,
) -> PairsLogprobs:
    """Log-probs (and entropy) of each completion given its prompt, in one forward
    (:func:`completion_outputs`, whose `packed` this is).

    `truncation` (the sampler's top-p / top-k) adds the log of the probability mass the
    sampler kept at each position, from the same logits.
    """
    out = completion_outputs(model, prompts, completions, packed=packed, pad_id=pad_id)
    logp, entropy = _logprobs_and_entropy(
        out.logits, out.labels, temperature, with_entropy, entropy_grad, chunk_size
    )
    kept = None
    if truncation is not None and truncation.active:
        kept = out.to_rows(kept_log_mass(out.logits, truncation, temperature=temperature))
    return PairsLogprobs(
        out.to_rows(logp),
        None if entropy is None else out.to_rows(entropy),
        out.mask.to(logp.device),
        kept,
    )
