"""The coefficient of a KL penalty folded into the rewards: fixed, or adapted towards a target."""


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
