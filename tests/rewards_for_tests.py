"""Custom rewards for integration tests (loaded as ``tests.rewards_for_tests:<name>``)."""

from __future__ import annotations

import itertools
import threading


def digit_fraction(completion: str, sample: dict) -> tuple[float, dict]:
    """Fraction of digit characters: a dense signal even for a tiny random model's gibberish."""
    score = sum(c.isdigit() for c in completion) / max(1, len(completion))
    return score, {"formatted": False, "correct": False, "length": len(completion)}


def always_raises(completion: str, sample: dict) -> float:
    """Exercises the error path of ``grpo.tasks.score``."""
    raise RuntimeError("boom")


def text_length(completion: str, sample: dict) -> tuple[float, dict]:
    """Longer answers score higher: varies across a random model's samples, so advantages are
    non-zero and the integration test's gradient steps really move the weights."""
    return min(len(completion), 200) / 200, {"formatted": False, "correct": False}


def flat_on_odd_questions(completion: str, sample: dict) -> tuple[float, dict]:
    """Every answer to a question of odd length scores the same: a flat group, which dynamic
    sampling must drop; other questions score by answer length."""
    if len(sample["question"]) % 2:
        return 0.5, {"formatted": False, "correct": False}
    return text_length(completion, sample)


def even_length_is_correct(completion: str, sample: dict) -> tuple[float, dict]:
    """'Correct' when the answer has an even number of characters: a random model's samples are
    right about half the time, so pass@k has something to count; formatted when it is long."""
    correct = len(completion) % 2 == 0
    return float(correct), {"formatted": len(completion) > 20, "correct": correct}


def slow_text_length(completion: str, sample: dict) -> tuple[float, dict]:
    """text_length, 50 ms a call: a batch of 16 answers takes a second to score, so a test's
    run lasts long enough for its sampler failures to be noticed before it ends."""
    import time

    time.sleep(0.05)
    return text_length(completion, sample)


_calls = itertools.count()


def first_call_hangs(completion: str, sample: dict) -> tuple[float, dict]:
    """slow_text_length, except that the process's first call never returns: a hung reward,
    which reward.timeout_s must turn into one answer scored 0."""
    if next(_calls) == 0:
        threading.Event().wait()
    return slow_text_length(completion, sample)
