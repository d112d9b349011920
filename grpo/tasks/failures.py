"""How often the reward fails. `grpo.tasks.score` turns a reward that raises into a 0.0 with a
``reward_error`` (one broken answer must not end a run), but a reward that raises on every
answer (a bug, a wrong signature, a missing column) would then train the whole run on zeros.
`FailureRate` watches the share of answers whose reward failed among the last WINDOW scored and
stops the run, naming the reward and its first error, once it passes reward.max_error_rate; and
at once, at the first batch, when every answer so far failed: a 1-step smoke run of a broken
reward must not end "run complete"."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

# Answers the rate is taken over, and the fewest it is judged on: a lone error among the
# first few answers is no rate.
WINDOW = 256
LEAST = 32


class RewardFailingError(RuntimeError):
    """The reward failed on more than reward.max_error_rate of the last answers."""


class FailureRate:
    def __init__(self, reward: str, bound: float, window: int = WINDOW, least: int = LEAST):
        """`reward`: its name in the error; `bound`: the share of failures allowed (1.0: any)."""
        self.reward, self.bound, self.least = reward, bound, least
        self.recent: deque[bool] = deque(maxlen=window)
        self.first: str | None = None  # the run's first error, as the reward raised it

    def add(self, results: Sequence[tuple[float, dict]]) -> None:
        """Count a batch's `(reward, info)` results; raises RewardFailingError past the bound."""
        for _, info in results:
            error = info.get("reward_error")
            self.recent.append(error is not None)
            if error is not None and self.first is None:
                self.first = str(error)
        failed, seen = sum(self.recent), len(self.recent)
        every_one = len(results) > 1 and failed == seen  # a batch and all before it failed
        if (seen >= self.least or every_one) and failed > self.bound * seen:
            raise RewardFailingError(
                f"the reward {self.reward} failed on {failed} of the last {seen} answers "
                f"(reward.max_error_rate={self.bound}); its first error: {self.first}"
            )
