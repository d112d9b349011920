"""Reward shaping applied before advantages: pure functions of per-sequence tensors."""

from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment: (B,) response lengths -> (B,) penalties <= 0.

    0 while length <= max_len - buffer, then falling linearly to -factor at max_len (and
    staying there beyond): answers that run into the length limit lose reward gradually rather
    than all at once, so the policy learns to finish before it is cut off.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"buffer must be in [1, max_len={max_len}], got {buffer}")
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0, max=float(buffer))  # (B,)
    return -factor * over / buffer
