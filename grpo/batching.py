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


def pad_right(arrays: Sequence[np.ndarray], width: int, fill: float = 0.0) -> torch.Tensor:
    """Per-token float arrays (old/ref log-probs) as a (B, width) tensor aligned with the mask."""
    out = torch.full((len(arrays), width), fill, dtype=torch.float32)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = torch.as_tensor(np.asarray(a), dtype=torch.float32)
    return out
