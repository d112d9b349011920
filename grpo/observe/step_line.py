"""The trainer's one console line per step, the same on a terminal and in a piped or SLURM log:
what a person watching a run reads (TRL prints a step table, verl a metrics line per step).

  step  5/48 | 112.3 s | ETA 1:20:11 | reward 0.078 | format 0.78 | acc 0.00 | len 49 | kl 0.0012
  step  6/48 |  93.6 s | ETA 1:05:40 | reward 0.066 | format 0.66 | acc 0.00 | ALARM repeat

Fields a step did not compute (no KL without a KL term, no format for a reward whose info does
not say) are left out, never shown as 0. An alarm is the degeneration watch's
(grpo.observe.degeneration): the answers are being gamed, or were never sound.
"""

from __future__ import annotations

from typing import Any

# (label, the metrics row's key, its format), in the order shown
FIELDS = (
    ("reward", "reward_mean", ".3f"),
    ("format", "format_rate", ".2f"),
    ("acc", "accuracy", ".2f"),
    ("len", "response_len_mean", ".0f"),
    ("kl", "kl", ".4f"),
)


def clock(seconds: float) -> str:
    """`seconds` as H:MM:SS (M:SS under an hour)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def step_line(row: dict[str, Any], total: int, seconds: float | None, eta_s: float | None) -> str:
    """The line of step `row["step"]` of `total`: its wall `seconds` (None for the first step
    after a start, whose time includes the start) and the estimated time left."""
    width = len(str(total))
    parts = [f"step {row['step']:>{width}}/{total}"]
    parts.append(f"{seconds:5.1f} s" if seconds is not None else "    - s")
    parts.append(f"ETA {clock(eta_s)}" if eta_s is not None else "ETA -")
    parts += [f"{label} {format(row[key], spec)}" for label, key, spec in FIELDS if key in row]
    if row.get("degen_alarms"):  # the measures' keys, degen_<name>_frac: their names
        names = [a.removeprefix("degen_").removesuffix("_frac") for a in row["degen_alarms"]]
        parts.append("ALARM " + ", ".join(names))
    return " | ".join(parts)


class StepClock:
    """Seconds per step as the trainer sees them (from one step's line to the next) and the
    time left at their mean."""

    def __init__(self, total: int, now: float):
        self.total, self.last, self.spent, self.timed = total, now, 0.0, 0
        self.ticked = False

    def tick(self, step: int, now: float) -> tuple[float | None, float | None]:
        """(this step's seconds, the estimated seconds left); (None, None) at the first tick:
        the first step of this process, whose seconds include the start, neither counts nor
        shows."""
        seconds, self.last = now - self.last, now
        if not self.ticked:
            self.ticked = True
            return None, None
        self.spent += seconds
        self.timed += 1
        return seconds, self.spent / self.timed * max(0, self.total - step)
