"""Is the run being gamed? Degeneration measures of each step's answers and of each
evaluation's, and the alarm that names a measure past its threshold with one offending answer.

A reward that a model can farm rises while its answers degenerate: the CPU demo once reached
"format 1.00" by writing `#### 2` twenty times (issue 58). The measures (docs/outputs.md):

- `degen_repeat_frac`: answers that repeat a line or a run of words (grpo.tasks.answer_form);
- `degen_multi_marker_frac`: answers holding more than one answer marker (where the task counts
  them: `Task.count_markers`);
- `degen_refused_frac`: of the answers the reward paid for, those a stricter check refuses
  (they repeat themselves, hold several markers, or the reward's own info says "refused");
- `degenerate_frac`: answers that repeat themselves or hold several markers;
- `degen_length_ratio`: the mean answer length against the run's first steps (or first
  evaluation): a collapse to a bare marker, or a runaway to the length limit;
- `degen_entropy_ratio`: the policy's entropy against the run's first steps (steps only);
- `degen_false_equation_frac`: of the answers whose working states an equation of plain numbers
  ("48 - 6 = 32"), those with a false one. No alarm: false arithmetic games no reward here, but
  says what a worked answer's form is worth (the CPU demo's are mostly false).

Users' own tasks get every measure but the markers with no code of theirs. Each is a pure
function of the answers; `Watch` keeps the baselines and says when a measure crosses its
threshold (once, and again only when the set of measures past theirs changes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpo.tasks.answer_form import equations, repetition

log = logging.getLogger("grpo.trainer")

BASELINE_STEPS = 2  # the steps (from 1) whose lengths and entropy the ratios are measured against
EXAMPLE_CHARS = 160  # of the offending answer quoted in the warning

# measure -> (bound, "above" or "below"): past it, the run warns (docs/outputs.md).
THRESHOLDS: dict[str, tuple[float, str]] = {
    "degen_repeat_frac": (0.2, "above"),
    "degen_multi_marker_frac": (0.1, "above"),
    "degen_refused_frac": (0.2, "above"),
    "degen_length_collapse": (0.4, "below"),  # degen_length_ratio
    "degen_length_runaway": (2.5, "above"),  # degen_length_ratio
    "degen_entropy_ratio": (0.4, "below"),
}
# What a measure past its threshold suggests, where it is not "reward hacking?": entropy falls
# as a policy grows sure of right answers too (the CPU recipe's from its step 4, answering
# 'Ann has 18 + 5 = 23 apples.' then '#### 23').
SUGGESTS = {"degen_entropy_ratio": "exploring less?"}
_MEASURED = dict.fromkeys(("degen_length_collapse", "degen_length_runaway"), "degen_length_ratio")

CountMarkers = Callable[[str], int]


def flags(text: str, count_markers: CountMarkers | None) -> list[str]:
    """What is degenerate about one answer: "repeats itself", "N answer markers"; [] if nothing."""
    out = ["repeats itself"] if repetition(text) is not None else []
    markers = count_markers(text) if count_markers is not None else 0
    return out + ([f"{markers} answer markers"] if markers > 1 else [])


def measures(
    texts: Sequence[str],
    rewards: Sequence[float],
    refused: Sequence[bool],
    count_markers: CountMarkers | None,
) -> dict[str, float]:
    """The per-answer shares of `texts`, each with its reward and whether the reward's own info
    says it refused the answer ("refused"); {} for none."""
    if not texts:
        return {}
    repeats = [repetition(t) is not None for t in texts]
    many = [count_markers(t) > 1 for t in texts] if count_markers is not None else []
    degenerate = [r or (bool(many) and many[i]) for i, r in enumerate(repeats)]
    row = {"degen_repeat_frac": _share(repeats), "degenerate_frac": _share(degenerate)}
    if many:
        row["degen_multi_marker_frac"] = _share(many)
    stated = [equations(t) for t in texts]
    if checked := [any(not agree for _, agree in found) for found in stated if found]:
        row["degen_false_equation_frac"] = _share(checked)
    paid = [i for i, r in enumerate(rewards) if r > 0]
    if paid:
        row["degen_refused_frac"] = _share([degenerate[i] or refused[i] for i in paid])
    return row


def ratio(value: float | None, baseline: float | None) -> float | None:
    """`value` against `baseline`; None when either is missing or the baseline is not positive."""
    if value is None or baseline is None or baseline <= 0:
        return None
    return value / baseline


def past(row: dict[str, Any]) -> dict[str, float]:
    """The measures of `row` past their thresholds, with their values."""
    out = {}
    for name, (bound, side) in THRESHOLDS.items():
        value = row.get(_MEASURED.get(name, name))
        if isinstance(value, int | float) and (value > bound if side == "above" else value < bound):
            out[name] = float(value)
    return out


def _tail(text: str) -> str:
    """The end of an answer, where a loop or a pile of markers shows, in EXAMPLE_CHARS."""
    return text if len(text) <= EXAMPLE_CHARS else "..." + text[3 - EXAMPLE_CHARS :]


def _share(flags_: Sequence[bool]) -> float:
    return sum(flags_) / len(flags_)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class _Baseline:
    """The first rows' mean of each key the ratios read."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    size: int = BASELINE_STEPS

    def add(self, row: dict[str, Any]) -> None:
        if len(self.rows) < self.size:
            self.rows.append(row)

    def of(self, key: str) -> float | None:
        return _mean([float(r[key]) for r in self.rows if isinstance(r.get(key), int | float)])


class Watch:
    """Rank 0's eye on the answers: adds the measures to each step's and each evaluation's row
    and warns when the set of measures past their thresholds changes, naming each and quoting
    one offending answer. `first_steps`, `first_evals`: the rows a resumed run already wrote."""

    def __init__(
        self,
        count_markers: CountMarkers | None,
        first_steps: Sequence[dict[str, Any]] = (),
        first_evals: Sequence[dict[str, Any]] = (),
    ):
        self.count_markers = count_markers
        self.steps, self.evals = _Baseline(), _Baseline(size=1)
        for row in first_steps:
            self.steps.add(row)
        for row in first_evals:
            self.evals.add(row)
        self.alarmed: dict[str, set[str]] = {"step": set(), "eval": set()}

    def step(
        self,
        row: dict[str, Any],
        texts: Sequence[str],
        rewards: Sequence[float],
        refused: Sequence[bool],
    ) -> None:
        """Add the measures to a step's metrics `row` (its answers, their rewards, the reward's
        refusals), and warn."""
        row.update(measures(texts, rewards, refused, self.count_markers))
        if row.get("step", 0) <= BASELINE_STEPS:
            self.steps.add(row)
        for key, name in (
            ("response_len_mean", "degen_length_ratio"),
            ("entropy", "degen_entropy_ratio"),
        ):
            value = ratio(row.get(key), self.steps.of(key))
            if value is not None:
                row[name] = value
        self._warn("step", int(row["step"]), row, texts)

    def eval(self, row: dict[str, Any], texts: Sequence[str]) -> None:
        """Add the length ratio to an evaluation's `row` (its measures are summarise's, from its
        greedy answers `texts`), and warn."""
        self.evals.add(row)
        value = ratio(row.get("response_len_mean"), self.evals.of("response_len_mean"))
        if value is not None:
            row["degen_length_ratio"] = value
        self._warn("eval", int(row["version"]), row, texts)

    def _warn(self, kind: str, at: int, row: dict[str, Any], texts: Sequence[str]) -> None:
        now = past(row)
        row["degen_alarms"] = sorted(now)
        before = self.alarmed[kind]
        where = f"step {at}" if kind == "step" else f"eval v{at}"
        initial = kind == "eval" and at == 0  # the model before training: not (yet) gamed
        for name in sorted(now.keys() - before):
            bound, side = THRESHOLDS[name]
            said = "the initial model:" if initial else SUGGESTS.get(name, "reward hacking?")
            log.warning(
                "%s %s: %s %.3f, %s its threshold %g; e.g. %r",
                said,
                where,
                _MEASURED.get(name, name),
                now[name],
                side,
                bound,
                _tail(self._example(name, texts)),
            )
        for name in sorted(before - now.keys()):
            log.info("%s: %s back within its threshold", where, name)
        self.alarmed[kind] = set(now)

    def _example(self, name: str, texts: Sequence[str]) -> str:
        """One answer that shows what measure `name` measures."""
        if not texts:
            return ""
        if name == "degen_length_collapse":
            return min(texts, key=len)
        if name == "degen_length_runaway":
            return max(texts, key=len)
        flagged = [t for t in texts if flags(t, self.count_markers)]
        return flagged[0] if flagged else texts[0]
