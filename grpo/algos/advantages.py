"""Group-relative advantages (GRPO / Dr. GRPO) and per-token broadcasting."""

import torch
from torch import Tensor

from grpo.algos.registry import register_advantage_estimator


@register_advantage_estimator("grpo")
def group_advantages(
    rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Outcome advantages normalised within each group of `group_size` samples.

    rewards: (N,) with the G completions of one prompt stored contiguously, N = n_groups * G.
    GRPO:     A = (r - mean_g) / (std_g + eps), std unbiased (torch.std's default).
    Dr. GRPO: A = r - mean_g (scale_by_std=False): dividing by std up-weights groups whose
              rewards barely differ (too easy / too hard prompts), which biases the gradient.
    group_size == 1 -> all zeros: a lone sample has no baseline to compare against and its
    unbiased std is undefined (NaN), so it carries no learning signal.
    Groups with identical rewards get A = 0 in both variants (std = 0, numerator = 0).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    rewards = rewards.float()
    if group_size == 1:
        return torch.zeros_like(rewards)
    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    adv = grouped - grouped.mean(dim=-1, keepdim=True)  # (n_groups, G)
    if scale_by_std:
        adv = adv / (grouped.std(dim=-1, keepdim=True) + eps)
    return adv.view(-1)  # (N,)


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO: group mean baseline without the std normalisation. (N,) -> (N,)"""
    return group_advantages(rewards, group_size, scale_by_std=False, eps=eps)


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Give every valid response token its sequence's value: (B,), (B, T) -> (B, T)."""
    return seq_values[:, None] * mask.to(seq_values.dtype)
