"""Memory-efficient per-token log-probs and entropies from LM logits.

With a 150k-token vocabulary, a float32 log_softmax of the logits of a (8, 2048) batch is
~10 GB. Everything here walks the sequence in chunks so that only one chunk's float32
softmax exists at a time, and the log-prob gradient is computed chunk by chunk in backward
instead of autograd keeping every chunk's intermediates alive.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


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


def kept_tokens(sorted_logp: Tensor, truncation: Truncation) -> Tensor:
    """Which tokens top-k then top-p keep, per row of log-probs sorted ascending (N, V), as
    vLLM and HF pick them: top-k keeps values >= the k-th largest; top-p then drops, in
    ascending order, the tokens whose cumulative (top-k renormalised) probability is <= 1 - p,
    keeping the last. A bool mask (N, V) aligned with `sorted_logp`."""
    keep = torch.ones_like(sorted_logp, dtype=torch.bool)
    V = sorted_logp.shape[-1]
    if 0 < truncation.top_k < V:
        keep &= sorted_logp >= sorted_logp[:, V - truncation.top_k, None]
    if truncation.top_p < 1.0:
        cum = sorted_logp.masked_fill(~keep, -torch.inf).softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - truncation.top_p
        drop[:, -1] = False
        keep &= ~drop
    return keep


def _chunk_kept_log_mass(z: Tensor, truncation: Truncation) -> Tensor:
    """log of the mass top-k then top-p keep (kept_tokens), per row of z (N, V)."""
    logp = z.log_softmax(dim=-1).sort(dim=-1).values  # ascending
    return logp.masked_fill_(~kept_tokens(logp, truncation), -torch.inf).logsumexp(dim=-1)


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
