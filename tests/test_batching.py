"""Tests for grpo.core.batching: packing pairs into one row and planning micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grpo.core.batching import micro_batch_ranges, pack_pairs, split_to_count


def test_pack_pairs_layout() -> None:
    packed = pack_pairs([np.array([5, 6]), np.array([7])], [np.array([8, 9, 10]), np.array([11])])
    assert packed.input_ids.tolist() == [[5, 6, 8, 9, 10, 7, 11]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    # the logits at a position predict the next token: 6 predicts 8, ..., 7 predicts 11
    assert packed.logit_index.tolist() == [1, 2, 3, 5]
    assert packed.labels.tolist() == [8, 9, 10, 11]
    assert packed.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    flat = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert packed.unpack(flat).tolist() == [[1, 2, 3], [4, 0, 0]]


def test_pack_pairs_refuses_empty_prompts() -> None:
    with pytest.raises(ValueError, match="non-empty prompts"):
        pack_pairs([np.array([], np.int32)], [np.array([1])])
    with pytest.raises(ValueError, match="as many"):
        pack_pairs([np.array([1])], [])


def test_micro_batches_by_count() -> None:
    sizes = [(3, 4)] * 7
    assert micro_batch_ranges(sizes, 3, 0, packed=True) == [(0, 3), (3, 6), (6, 7)]


def test_micro_batches_by_token_budget() -> None:
    sizes = [(2, 3), (2, 3), (2, 3), (10, 20), (1, 1), (1, 1)]
    # packed: 5 + 5 + 5 = 15 fits in 16; the 30-token pair is over budget and goes alone
    assert micro_batch_ranges(sizes, 1, 16, packed=True) == [(0, 3), (3, 4), (4, 6)]
    # padded: rows x (longest prompt + longest completion); 3 x 5 = 15 fits, but adding a
    # (1, 1) after the long pair would cost 2 x 30
    assert micro_batch_ranges(sizes, 1, 16, packed=False) == [(0, 3), (3, 4), (4, 6)]
    assert micro_batch_ranges([(4, 4), (1, 9)], 1, 18, packed=False) == [(0, 1), (1, 2)]
    assert micro_batch_ranges([(4, 4), (1, 9)], 1, 18, packed=True) == [(0, 2)]


@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 50)), min_size=1, max_size=40),
    st.integers(1, 200),
    st.booleans(),
)
def test_micro_batches_cover_everything_within_budget(sizes, budget, packed) -> None:
    ranges = micro_batch_ranges(sizes, 1, budget, packed)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(sizes)))
    for a, b in ranges:
        part = sizes[a:b]
        cost = (sum(p + c for p, c in part) if packed
                else len(part) * (max(p for p, _ in part) + max(c for _, c in part)))  # fmt: skip
        assert cost <= budget or b - a == 1


@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(0, 20))
def test_split_to_count(lengths, extra) -> None:
    bounds = np.cumsum([0, *lengths]).tolist()
    ranges = list(zip(bounds[:-1], bounds[1:], strict=True))
    count = min(len(ranges) + extra, bounds[-1])
    out = split_to_count(ranges, count)
    assert len(out) == count and all(b > a for a, b in out)
    assert [i for a, b in out for i in range(a, b)] == list(range(bounds[-1]))


def test_split_to_count_refuses_the_impossible() -> None:
    with pytest.raises(ValueError):
        split_to_count([(0, 2)], 3)
    with pytest.raises(ValueError):
        split_to_count([(0, 1), (1, 2)], 1)
