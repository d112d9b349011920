"""Padding prompt/completion pairs into the one tensor layout sampler and trainer share.

Prompts are LEFT-padded to a common length P and completions RIGHT-padded after them, so
completion token j of every row sits at column P + j (the layout HF generate produces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PaddedPairs:
    input_ids: torch.Tensor  # (B, P + C) long
    attention_mask: torch.Tensor  # (B, P + C) long
    response_mask: torch.Tensor  # (B, C) float: 1 for real completion tokens
    prompt_len: int  # P


def pad_pairs(
    prompts: Sequence[np.ndarray], completions: Sequence[np.ndarray], pad_id: int
) -> PaddedPairs:
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("pad_pairs needs as many prompts as completions, at least one")
    P = max(len(p) for p in prompts)
    C = max(1, max(len(c) for c in completions))  # >= 1 column so shapes stay valid
    B = len(prompts)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, P - len(p) : P] = torch.as_tensor(p, dtype=torch.long)
        ids[i, P : P + len(c)] = torch.as_tensor(c, dtype=torch.long)
        attn[i, P - len(p) : P + len(c)] = 1
    return PaddedPairs(ids, attn, attn[:, P:].float(), P)


def length_mask(lengths: Sequence[int]) -> torch.Tensor:
    """(B, max(lengths, 1)) float mask with lengths[i] leading ones in row i."""
    n = torch.as_tensor(list(lengths), dtype=torch.long)
    width = max(1, int(n.max())) if len(n) else 1
    return (torch.arange(width)[None, :] < n[:, None]).float()


def pad_answers(
    flat: np.ndarray, lengths: np.ndarray, width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A per-token column of a batch (every answer's array back to back, grpo.core.columns,
    answer i holding lengths[i]) as a (B, width) tensor aligned with the mask, 0 on padding:
    one scatter for the whole batch, no loop over its answers."""
    lengths = np.asarray(lengths, np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.cumsum(lengths) - lengths
    cols = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    out = torch.zeros((len(lengths), width), dtype=dtype)
    # a copy: the column may be a read-only view of the received frame
    out[torch.from_numpy(rows), torch.from_numpy(cols)] = torch.tensor(flat, dtype=dtype)
    return out


# ----------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class PackedPairs:
    """Prompt/completion pairs back to back in one row, with no padding at all.

    Position ids restart at 0 for each pair; given position ids and no attention mask,
    transformers keeps attention within each pair (it reads the restarts as boundaries).
    """

    input_ids: torch.Tensor  # (1, S) long, S = sum of prompt + completion lengths
    position_ids: torch.Tensor  # (1, S) long
    logit_index: torch.Tensor  # (K,) long: the positions whose logits predict a completion token
    labels: torch.Tensor  # (K,) long: the completion token each of those predicts
    rows: torch.Tensor  # (K,) long: its pair, for scattering back to the padded (B, C) layout
    cols: torch.Tensor  # (K,) long: its index within the completion
    response_mask: torch.Tensor  # (B, C) float, as PaddedPairs.response_mask

    def unpack(self, flat: torch.Tensor) -> torch.Tensor:
        """(1, K) values, one per completion token -> (B, C) with zeros at padding;
        differentiable."""
        rows, cols = self.rows.to(flat.device), self.cols.to(flat.device)
        return flat.new_zeros(self.response_mask.shape).index_put((rows, cols), flat[0])


def pack_pairs(prompts: Sequence[np.ndarray], completions: Sequence[np.ndarray]) -> PackedPairs:
    if len(prompts) != len(completions) or not prompts:
        raise ValueError("pack_pairs needs as many prompts as completions, at least one")
    if any(len(p) == 0 for p in prompts):
        raise ValueError(
            "pack_pairs needs non-empty prompts (the first completion token "
            "is predicted by the last prompt token)"
        )
    ids, pos, index, rows, cols = [], [], [], [], []
    offset = 0
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        n = len(p) + len(c)
        ids.append(np.concatenate([p, c]).astype(np.int64, copy=False))
        pos.append(np.arange(n))
        index.append(offset + len(p) - 1 + np.arange(len(c)))  # logits at t predict token t + 1
        rows.append(np.full(len(c), i))
        cols.append(np.arange(len(c)))
        offset += n
    if all(len(c) == 0 for c in completions):
        # no completion tokens at all: one masked-out dummy keeps the loss's graph connected
        index = rows = cols = [np.zeros(1, np.int64)]
    flat_ids = torch.from_numpy(np.concatenate(ids))
    logit_index = torch.from_numpy(np.concatenate(index).astype(np.int64))
    return PackedPairs(
        input_ids=flat_ids[None],
        position_ids=torch.from_numpy(np.concatenate(pos))[None],
        logit_index=logit_index,
        labels=flat_ids[(logit_index + 1).clamp(max=len(flat_ids) - 1)],
        rows=torch.from_numpy(np.concatenate(rows).astype(np.int64)),
        cols=torch.from_numpy(np.concatenate(cols).astype(np.int64)),
        response_mask=length_mask([len(c) for c in completions]),
    )


# ----------------------------------------------------------------------------- micro-batches


def micro_batch_tokens(sizes: Sequence[tuple[int, int]], packed: bool) -> int:
    """Tokens one forward over pairs with (prompt, completion) `sizes` computes: the sum of
    the lengths when packed; rows x (longest prompt + longest completion) when padded."""
    if packed:
        return sum(p + c for p, c in sizes)
    return len(sizes) * (max(p for p, _ in sizes) + max(c for _, c in sizes))


def micro_batch_ranges(
    sizes: Sequence[tuple[int, int]], max_seqs: int, max_tokens: int, packed: bool
) -> list[tuple[int, int]]:
    """Contiguous [start, stop) micro-batches of pairs with (prompt, completion) `sizes`.

    With max_tokens > 0 a micro-batch is filled until the tokens its forward computes
    (:func:`micro_batch_tokens`) would pass max_tokens; one pair longer than that gets one of
    its own. With max_tokens == 0 every micro-batch holds max_seqs pairs.
    """
    if max_tokens <= 0:
        return [(s, min(s + max_seqs, len(sizes))) for s in range(0, len(sizes), max_seqs)]
    if not sizes:
        return []
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(sizes)):
        if micro_batch_tokens(sizes[start : i + 1], packed) > max_tokens:
            out.append((start, i))
            start = i
    out.append((start, len(sizes)))
    return out


def length_order(sizes: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of (prompt, completion) `sizes`, shortest completion first: contiguous
    micro-batches then hold similar lengths and pad less. The gradient of a mini-batch is a sum
    over its sequences, so their order does not change it."""
    return sorted(range(len(sizes)), key=lambda i: (sizes[i][1], sizes[i][0]))


def split_to_count(ranges: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """`ranges` split, largest first, into exactly `count` non-empty ranges.

    Every trainer rank must run the same number of backward passes (ZeRO-2 reduces the
    gradients of each one), so a rank whose micro-batches came out fewer splits some.
    """
    out = list(ranges)
    if count < len(out) or count > sum(b - a for a, b in out):
        raise ValueError(f"cannot split {len(out)} ranges of {out} into {count}")
    while len(out) < count:
        i = max(range(len(out)), key=lambda k: out[k][1] - out[k][0])
        a, b = out[i]
        mid = (a + b + 1) // 2
        out[i : i + 1] = [(a, mid), (mid, b)]
    return out
