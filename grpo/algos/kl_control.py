"""The coefficient of a KL penalty folded into the rewards: fixed, or adapted towards a target."""

from dataclasses import dataclass


def adaptive_kl_coef(
    coef: float, current_kl: float, target: float, horizon: float, n_steps: int
) -> float:
    """Ziegler et al. (2019): nudge the coefficient so the observed KL tracks `target`.

    error = clip(current_kl / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon.
    The clip keeps one noisy batch from moving the coefficient much; `n_steps` (samples in the
    batch) over `horizon` (samples) sets how fast it adapts.
    """
    if target <= 0 or horizon <= 0:
        raise ValueError(f"target and horizon must be > 0, got {target}, {horizon}")
    error = min(max(current_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)


@dataclass(frozen=True)
class KlControl:
    """How the in-reward KL coefficient moves from one step to the next: kept, or adapted
    towards `target` (adaptive_kl_coef). Built once from the config (grpo.plan)."""

    adaptive: bool = False
    target: float = 0.0
    horizon: float = 0.0

    def next(self, coef: float, current_kl: float | None, n_steps: int) -> float:
        """The coefficient for the next step, after a batch of `n_steps` samples whose
        sampling policy was `current_kl` from the reference (None: not measured, which an
        adaptive control cannot do without)."""
        if not self.adaptive:
            return coef
        if current_kl is None:
            raise ValueError(
                "adaptive KL control needs the batch's KL to the reference: "
                "both the old-policy and the reference log-probs"
            )
        return adaptive_kl_coef(coef, current_kl, self.target, self.horizon, n_steps)
