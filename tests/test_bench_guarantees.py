"""What the code guarantees is tested here, not benchmarked: rows whose target the code cannot
miss (a delta never bigger than the full copy; a trainer egress divided by a computed N) were
benchmark rows (weight_delta_fp32_share, weight_delta_lora_share,
weight_fanout_trainer_copies, weight_fanout_chaos_trainer_copies) until 2026-11-28. The e2e busy
share's arithmetic is tests/test_bench.py::test_e2e_busy_share_counts_generation_and_training.
"""

from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)
N = 1 << 18  # above the codec's probe threshold: the probed path is taken too


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(new, base) bit patterns, each a tensor of float32 (int32) or bfloat16 (int16) bits."""
    f32 = RNG.standard_normal(N).astype(np.float32)
    step = (f32 + RNG.standard_normal(N).astype(np.float32) * 1e-4).astype(np.float32)
    few = f32.copy()
    few[RNG.choice(N, 100, replace=False)] += 1.0
    bf16 = f32.view(np.int32) >> 16  # the high half: a bfloat16's bits
    return {
        # every element changed to an unrelated value: nothing to gain, FULL must win
        "fp32 re-initialised": (
            RNG.standard_normal(N).astype(np.float32).view(np.int32),
            f32.view(np.int32),
        ),  # fmt: skip
        "fp32 random bits": (
            RNG.integers(-(2**31), 2**31, N, dtype=np.int32),
            RNG.integers(-(2**31), 2**31, N, dtype=np.int32),
        ),  # fmt: skip
        "bf16 random bits": (
            RNG.integers(-(2**15), 2**15, N, dtype=np.int16),
            RNG.integers(-(2**15), 2**15, N, dtype=np.int16),
        ),  # fmt: skip
        # an AdamW-sized step, a few elements changed, nothing changed
        "fp32 small step": (step.view(np.int32), f32.view(np.int32)),
        "fp32 few changed": (few.view(np.int32), f32.view(np.int32)),
        "bf16 small step": ((step.view(np.int32) >> 16).astype(np.int16), bf16.astype(np.int16)),
        "fp32 unchanged": (f32.view(np.int32).copy(), f32.view(np.int32)),
        "small tensor": (RNG.integers(0, 9, 7, dtype=np.int32), RNG.integers(0, 9, 7, np.int32)),
    }


CASES = _cases()


@pytest.mark.parametrize("case", CASES)
def test_a_delta_is_never_bigger_than_the_full_copy_and_decodes_back(case):
    """What weight_delta_fp32_share and weight_delta_lora_share (target <= 1.0) measured."""
    from grpo.weights.stream.deltas import decode, encode

    new, base = CASES[case]
    enc = encode(new, base)
    assert enc.nbytes <= new.nbytes, (case, enc.kind, enc.nbytes, new.nbytes)
    got = decode(enc.kind, enc.parts, base, new.dtype, new.size)
    assert np.array_equal(got, new), case


def test_an_incompressible_delta_is_sent_full_and_a_small_step_is_not():
    """The bound is met by choosing FULL, not by never trying a delta."""
    from grpo.weights.stream.deltas import FULL, encode

    assert encode(*CASES["fp32 random bits"]).kind == FULL
    small = encode(*CASES["fp32 few changed"])
    assert small.kind != FULL and small.nbytes < CASES["fp32 few changed"][0].nbytes / 10


def test_the_trainer_sends_each_version_about_once_whatever_the_receivers():
    """What weight_fanout_trainer_copies and weight_fanout_chaos_trainer_copies (target <= 1.2)
    measured: the trainer's egress per version, counted by its server, over the payload, for 1
    and 4 relaying receivers in processes of their own, and with an interior relay SIGKILLed
    mid-version and restarted (its catch-up comes from its parent, not the trainer)."""
    from bench.weight_fanout import QUICK, measure

    runs, chaos = measure(QUICK, (1, 4), reps=1, chaos_n=4)
    for n, deliveries in runs.items():
        for d in deliveries:
            # at least the version once (it was sent whole), at most 1.2 copies of it
            assert 0.99 <= d.copies <= 1.2, (n, d)
    assert 0.99 <= chaos.copies <= 1.2, chaos
    assert chaos.catch_up_copies < 0.2 and chaos.parent_copies >= 0.99, chaos
