"""Memory-efficient per-token log-probs and entropies from LM logits.

With a 150k-token vocabulary, a float32 log_softmax of the logits of a (8, 2048) batch is
~10 GB. Everything here walks the sequence in chunks so that only one chunk's float32
softmax exists at a time, and the log-prob gradient is computed chunk by chunk in backward
instead of autograd keeping every chunk's intermediates alive.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from grpo.core.batching import PackedPairs, pack_pairs, pad_pairs
from grpo.progress import ACTIVITY


def _chunks(logits: Tensor, chunk_size: int):
    """Slices along T holding about `chunk_size` (row, position) pairs each.

    The budget counts tokens across the whole batch, so peak memory (~chunk_size * V floats)
    does not grow with B. Slicing along T keeps working on non-contiguous views such as
    `model(...).logits[:, p:-1]` without copying them.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    B, T = logits.shape[:2]
    step = max(1, chunk_size // max(B, 1))
    for start in range(0, T, step):
        yield slice(start, min(start + step, T))


def _scaled_chunk(logits: Tensor, sl: slice, temperature: float, writable: bool) -> Tensor:
    """logits[:, sl] / temperature in float32: (B, c, V).

    Float32 logits at temperature 1 are used as they are (no copy) unless the caller is
    going to write into the chunk.
    """
    chunk = logits[:, sl]
    if chunk.dtype == torch.float32 and temperature == 1.0 and not writable:
        return chunk
    return chunk.to(torch.float32, copy=True).div_(temperature)


def _chunk_logprobs(
    z: Tensor, labels: Tensor, with_entropy: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(log-prob of labels, logsumexp, entropy or None) of one float32 chunk z: (B, c, V).

    One exp over the chunk serves the logsumexp and the entropy, and it is the only
    full-vocabulary temporary: H = lse - sum_v exp(z_v - m) z_v / sum_v exp(z_v - m).
    """
    m = z.amax(dim=-1, keepdim=True)  # (B, c, 1)
    e = torch.sub(z, m).exp_()  # (B, c, V)
    total = e.sum(dim=-1)  # (B, c)
    lse = m.squeeze(-1) + total.log()
    logp = z.gather(-1, labels[..., None]).squeeze(-1) - lse
    entropy = lse - e.mul_(z).sum(dim=-1) / total if with_entropy else None
    return logp, lse, entropy


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / temperature)[labels], with a chunked hand-written backward.

    Saves only the inputs and the (B, T) logsumexp. Backward recomputes the softmax one chunk
    at a time: d logp_t / d z = (onehot(y_t) - softmax(z)) / temperature. The entropy, when
    asked for, comes out of the same pass and carries no gradient.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_size, with_entropy):
        B, T, _ = logits.shape
        out = logits.new_empty((B, T), dtype=torch.float32)
        lse = logits.new_empty((B, T), dtype=torch.float32)
        entropy = logits.new_empty((B, T), dtype=torch.float32) if with_entropy else None
        for sl in _chunks(logits, chunk_size):
            z = _scaled_chunk(logits, sl, temperature, writable=False)
            out[:, sl], lse[:, sl], ent = _chunk_logprobs(z, labels[:, sl], with_entropy)
            if entropy is not None:
                entropy[:, sl] = ent
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        if entropy is None:
            return out
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out: Tensor, *_unused: Tensor):
        logits, labels, lse = ctx.saved_tensors
        t = ctx.temperature
        grad_logits = torch.empty_like(logits)
        for sl in _chunks(logits, ctx.chunk_size):
            g = grad_out[:, sl, None].float() / t  # (B, c, 1)
            z = _scaled_chunk(logits, sl, t, writable=True)  # (B, c, V)
            grad = z.sub_(lse[:, sl, None]).exp_().mul_(-g)  # -g * softmax, in place
            grad.scatter_add_(-1, labels[:, sl, None], g)  # + g * onehot(label)
            grad_logits[:, sl] = grad.to(grad_logits.dtype)
        return grad_logits, None, None, None, None


def token_logprobs(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> Tensor:
    """log softmax(logits / temperature)[labels] per position: (B, T, V), (B, T) -> (B, T).

    Computed as gathered logit - logsumexp, in float32 whatever the logits dtype, chunk by
    chunk (`chunk_size` tokens across the batch at a time), never materialising a full
    (B, T, V) log_softmax. Differentiable w.r.t. logits. `temperature` is applied inside the
    chunks so that callers do not need a full-size `logits / temperature` copy either.
    """
    return _TokenLogprobs.apply(logits, labels.long(), float(temperature), chunk_size, False)


def token_logprobs_and_entropy(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[Tensor, Tensor]:
    """:func:`token_logprobs` and the entropy of softmax(logits / temperature) per position,
    (B, T, V) -> (B, T) twice, in one pass over the logits.

    The log-probs are differentiable w.r.t. logits; the entropy is a metric (no gradient:
    entropy collapse is the usual early sign of a dying GRPO run).
    """
    return _TokenLogprobs.apply(logits, labels.long(), float(temperature), chunk_size, True)


def _chunk_entropy(logits_chunk: Tensor, temperature: float) -> Tensor:
    z = logits_chunk.float() / temperature  # (B, c, V)
    lse = torch.logsumexp(z, dim=-1)  # (B, c)
    return lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def token_entropy_with_grad(
    logits: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> Tensor:
    """Differentiable entropy per position, (B, T, V) -> (B, T), for an entropy bonus.

    Each chunk runs under activation checkpointing, so backward recomputes its softmax instead
    of keeping one full-vocabulary tensor per chunk alive until then.
    """
    from torch.utils.checkpoint import checkpoint

    # split(), not slicing: the backward of a slice allocates a full-size zero gradient per
    # chunk, while split's backward concatenates the chunk gradients once.
    step = next(_chunks(logits, chunk_size)).stop
    parts = [
        checkpoint(_chunk_entropy, chunk, temperature, use_reentrant=False)
        for chunk in logits.split(step, dim=1)
    ]
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class Truncation:
    """The sampler's top-p / top-k: it draws from the kept tokens only, renormalised."""

    top_p: float = 1.0
    top_k: int = 0  # 0 = off

    @property
    def active(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0


def _chunk_kept_log_mass(z: Tensor, truncation: Truncation) -> Tensor:
    """log of the mass top-k then top-p keep, per row of z (N, V), as vLLM and HF pick it:
    top-k keeps values >= the k-th largest; top-p then drops, in ascending order, the
    tokens whose cumulative (top-k renormalised) probability is <= 1 - p, keeping the last."""
    logp = z.log_softmax(dim=-1).sort(dim=-1).values  # ascending
    keep = torch.ones_like(logp, dtype=torch.bool)
    V = logp.shape[-1]
    if 0 < truncation.top_k < V:
        keep &= logp >= logp[:, V - truncation.top_k, None]
    if truncation.top_p < 1.0:
        cum = logp.masked_fill(~keep, -torch.inf).softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - truncation.top_p
        drop[:, -1] = False
        keep &= ~drop
    return logp.masked_fill_(~keep, -torch.inf).logsumexp(dim=-1)


@torch.no_grad()
def kept_log_mass(
    logits: Tensor, truncation: Truncation, *, temperature: float = 1.0, chunk_size: int = 256
) -> Tensor:
    """Per position, log of the probability (under softmax(logits / temperature)) of the
    tokens a top-p / top-k sampler keeps: (B, T, V) -> (B, T), <= 0.

    An engine that samples from the truncated distribution reports log-probs over the kept
    tokens, log p(y) - log_kept_mass; subtract this from full-vocabulary log-probs to compare
    like with like. Chunked like the log-probs (each chunk is sorted, so chunks are smaller).
    """
    out = logits.new_empty(logits.shape[:2], dtype=torch.float32)
    for sl in _chunks(logits, chunk_size):
        z = _scaled_chunk(logits, sl, temperature, writable=False)
        out[:, sl] = _chunk_kept_log_mass(z.reshape(-1, z.shape[-1]), truncation).view(z.shape[:2])
    return out


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
    logits, labels = _completion_logits(model, input_ids, attention_mask, prompt_len)
    return _logprobs_and_entropy(
        logits, labels, temperature, with_entropy, entropy_grad, chunk_size
    )


def _completion_logits(
    model, input_ids: Tensor, attention_mask: Tensor, prompt_len: int
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
        logits_to_keep=n_keep,
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
    logits, labels = _packed_logits(model, packed)
    logp, entropy = _logprobs_and_entropy(
        logits, labels, temperature, with_entropy, entropy_grad, chunk_size
    )
    return packed.unpack(logp), None if entropy is None else packed.unpack(entropy)


def _packed_logits(model, packed: PackedPairs) -> tuple[Tensor, Tensor]:
    """The logits that predict the packed completion tokens, (1, K, V), and those tokens."""
    device = device_of(model)
    index = packed.logit_index.to(device)
    out = model(
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        use_cache=False,
        logits_to_keep=index,
    )
    logits = out.logits  # (1, K, V)
    if logits.shape[1] != index.numel():
        logits = logits[:, index]  # a model that ignores logits_to_keep returns all S positions
    return logits, packed.labels.to(device)[None]


def device_of(model) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


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
    """Log-probs (and entropy) of each completion given its prompt, in one forward.

    `packed` puts the pairs back to back in one row instead of padding them to a rectangle;
    both give the same numbers. `truncation` (the sampler's top-p / top-k) adds the log of
    the probability mass the sampler kept at each position, from the same logits.
    """
    if packed:
        pairs = pack_pairs(prompts, completions)
        logits, labels = _packed_logits(model, pairs)
        restore, mask = pairs.unpack, pairs.response_mask
    else:
        padded = pad_pairs(prompts, completions, pad_id)
        device = device_of(model)
        logits, labels = _completion_logits(
            model,
            padded.input_ids.to(device),
            padded.attention_mask.to(device),
            padded.prompt_len,
        )
        restore, mask = (lambda t: t), padded.response_mask
    logp, entropy = _logprobs_and_entropy(
        logits, labels, temperature, with_entropy, entropy_grad, chunk_size
    )
    kept = None
    if truncation is not None and truncation.active:
        kept = restore(kept_log_mass(logits, truncation, temperature=temperature))
    return PairsLogprobs(
        restore(logp),
        None if entropy is None else restore(entropy),
        mask.to(logp.device),
        kept,
    )


def score_for_training(
    policy,
    reference,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    rollout: Sequence[np.ndarray | None],
    *,
    truncation: Truncation,
    **score_args,
) -> tuple[list, list, list[np.ndarray | None]]:
    """Old-policy and reference log-probs of each completion, and the rollout engine's
    log-probs (None where there are none) put on the full vocabulary.

    A model given as None is not run and its log-probs are all None (grpo.config.passes says
    which passes a run needs). The engine reports log-probs over the tokens top-p / top-k kept;
    adding the log of the kept mass, measured with the policy's logits, makes them comparable
    with the old ones, the only log-probs they are compared with. Shared by the sampler and the
    trainer (train.logprobs_on); `score_args` go to :func:`score_pairs`."""
    absent: list = [None] * len(completions)
    old, ref, rollout = absent, absent, list(rollout)
    if policy is not None:
        has_rollout = all(r is not None for r in rollout)
        kept_by = truncation if has_rollout else None
        old, kept = score_pairs(policy, prompts, completions, truncation=kept_by, **score_args)
        if kept is not None:
            rollout = [r + m for r, m in zip(rollout, kept, strict=True)]
    if reference is not None:
        ref, _ = score_pairs(reference, prompts, completions, **score_args)
    return old, ref, rollout


@torch.no_grad()
def score_pairs(
    model,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    *,
    pad_id: int,
    temperature: float,
    packed: bool,
    truncation: Truncation | None = None,
    batch_size: int = 16,
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Per-token log-probs of each completion under `model`, `batch_size` pairs per forward:
    one float32 array per completion, and with an active `truncation` the log kept mass at
    each token too (else None). `packed` as in :func:`pairs_logprobs`."""
    logps: list[np.ndarray] = []
    masses: list[np.ndarray] | None = [] if truncation is not None and truncation.active else None
    for start in range(0, len(prompts), batch_size):
        chunk = completions[start : start + batch_size]
        out = pairs_logprobs(
            model,
            prompts[start : start + batch_size],
            chunk,
            packed=packed,
            pad_id=pad_id,
            temperature=temperature,
            truncation=truncation,
        )
        ACTIVITY.tick()  # a forward done: progress for the stall check (grpo.progress)
        for i, c in enumerate(chunk):
            logps.append(out.logp[i, : len(c)].float().cpu().numpy())
            if masses is not None and out.log_kept_mass is not None:
                masses.append(out.log_kept_mass[i, : len(c)].float().cpu().numpy())
    return logps, masses
