"""Whether an evaluation's accuracy moved: the two-sided two-proportion z-test of two versions'
greedy pass@1 (each a share of n held-out questions), and the line the closing summary and
`grpo eval` print with it.

The test treats the two versions' answers as independent samples, which they are not quite
(the same questions), so it is conservative next to a paired test for a change on the same
questions; it is the test a reader can redo from the two rates and counts alone.
"""

from __future__ import annotations

import math

SIGNIFICANT = 0.05  # the p below which the line says "significant"


def two_proportion_p(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    """The two-sided p-value of "both shares are the same" (pooled z-test); 1.0 when either
    count is 0 or the pooled share is 0 or 1 (nothing to tell apart)."""
    if n_a <= 0 or n_b <= 0:
        return 1.0
    pooled = (hits_a + hits_b) / (n_a + n_b)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if spread == 0:
        return 1.0
    z = (hits_b / n_b - hits_a / n_a) / spread
    return math.erfc(abs(z) / math.sqrt(2))


def _hits(row: dict, suffix: str) -> tuple[int, int] | None:
    """(correct answers, questions) of an eval row's accuracy under `suffix` ("" or "@name")."""
    rate, n = row.get(f"accuracy{suffix}"), row.get(f"n{suffix}")
    if rate is None or not n:
        return None
    return round(rate * n), int(n)


def accuracy_change(first: dict, last: dict) -> list[str]:
    """Per prompt set both rows scored (the task's and each variant's), one phrase: the two
    accuracies, the questions, and the p-value of the change."""
    suffixes = [""] + sorted(k.removeprefix("accuracy") for k in last if k.startswith("accuracy@"))
    phrases = []
    for suffix in suffixes:
        a, b = _hits(first, suffix), _hits(last, suffix)
        if a is None or b is None:
            continue
        p = two_proportion_p(*a, *b)
        verdict = "significant" if p < SIGNIFICANT else "not significant"
        name = suffix.removeprefix("@") or "accuracy"
        phrases.append(
            f"{name} {a[0] / a[1]:.3f} -> {b[0] / b[1]:.3f} of {b[1]} questions, "
            f"p = {p:.2g} ({verdict})"
        )
    return phrases
