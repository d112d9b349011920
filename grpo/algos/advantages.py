"""Advantage estimators and helpers to turn sequence rewards into per-token signals.

Outcome estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++-baseline, GRPO pass@k, GDPO) map
per-sequence rewards (N,) to (N,) (GDPO also reads the reward's components, (N, K)); token
estimators (REINFORCE++) work on (B, T) per-token rewards aligned with a response mask.
Batch whitening follows verl's convention (masked_whiten). GAE, which also needs the critic's
values, lives beside the value loss in grpo.algos.value.
"""

import torch
from torch import Tensor

from grpo.algos.registry import register_advantage_estimator, register_token_advantage_estimator


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """(N,) contiguous groups -> (N / G, G) float; ValueError if N is not a multiple of G."""
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a length divisible by group_size={group_size}, "
            f"got shape {tuple(rewards.shape)}"
        )
    return rewards.float().view(-1, group_size)


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
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    if group_size == 1:
        return torch.zeros_like(grouped).view(-1)
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


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean of the other G - 1 rewards of its group.

    rewards: (N,) with the G completions of one prompt stored contiguously, N = n_groups * G.
    Computed as G / (G - 1) * (r_i - mean_g), which equals the leave-one-out form. The baseline
    excludes the sample itself, so it is independent of r_i and the estimate stays unbiased.
    Needs group_size >= 2 (a lone sample has no others to compare against); identical rewards
    in a group give A = 0.
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2, got {group_size}")
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    adv = grouped - grouped.mean(dim=-1, keepdim=True)  # (n_groups, G)
    return (adv * (group_size / (group_size - 1))).view(-1)  # (N,)


def token_level_rewards(seq_rewards: Tensor, mask: Tensor) -> Tensor:
    """Put each sequence's scalar reward on its last valid token: (B,), (B, T) -> (B, T).

    Zeros everywhere else; rows with no valid token get nothing. This is the per-token reward
    that REINFORCE++ and GAE expect for outcome-only rewards.
    """
    if not seq_rewards.is_floating_point():
        seq_rewards = seq_rewards.float()
    valid = mask > 0  # (B, T)
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    # position * valid peaks at the last valid token; argmax returns 0 for an empty row, which
    # `& valid` then discards.
    last = (positions * valid).argmax(dim=-1)  # (B,)
    is_last = (positions == last[:, None]) & valid  # (B, T)
    return torch.where(is_last, seq_rewards[:, None], torch.zeros((), dtype=seq_rewards.dtype))


def masked_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8, unbiased: bool = True) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the valid tokens, times mask: (B, T) -> (B, T).

    The convention of verl's `masked_whiten` (and TRL's), which REINFORCE++ and GAE follow by
    default: unbiased variance (divides by n - 1) and eps inside the square root.
    `unbiased=False` divides by n (the population variance); with eps inside the root that
    agrees with the older (x - mean) / (std + eps) to about eps / var, relatively. The two
    conventions differ by the factor sqrt(n / (n - 1)), up to a few 1e-3 on a few hundred
    tokens. Fewer than two valid tokens (unbiased) or none at all give zeros, never NaN:
    x - mean is 0 on a lone valid token, and padding is multiplied away.
    """
    m = mask.to(x.dtype)  # (B, T)
    count = m.sum()
    mean = (x * m).sum() / count.clamp(min=1)
    dof = (count - 1 if unbiased else count).clamp(min=1)
    var = ((x - mean).square() * m).sum() / dof
    return (x - mean) * torch.rsqrt(var + eps) * m  # (B, T)


def as_float(x: Tensor) -> Tensor:
    """x as a float tensor (float32 if it is not floating already), so that integer or bool
    rewards accumulate discounted sums without truncation."""
    return x if x.is_floating_point() else x.float()


@register_token_advantage_estimator("reinforce_pp")
def reinforce_pp_advantages(
    token_rewards: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    eps: float = 1e-8,
    *,
    unbiased: bool = True,
) -> Tensor:
    """REINFORCE++: discounted return-to-go, whitened over the whole batch. (B, T) -> (B, T).

    G_t = r_t + gamma * G_{t'}, right to left, where t' is the next valid token: padding
    contributes no reward and no discount step, wherever it sits in the row. The returns are
    then whitened over all valid tokens of the batch by masked_whiten: (G - mean) /
    sqrt(var + eps) with the unbiased variance, verl's convention (`unbiased=False` for the
    population variance). A global rather than per-group baseline is what distinguishes
    REINFORCE++ (Hu 2025, arXiv:2501.03262) from GRPO. Padding positions are 0.
    """
    token_rewards = as_float(token_rewards)
    valid = mask > 0  # (B, T)
    returns = torch.zeros_like(token_rewards)  # (B, T)
    running = torch.zeros_like(token_rewards[:, 0])  # (B,), G of the next valid token
    for t in reversed(range(token_rewards.shape[-1])):
        running = torch.where(valid[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return masked_whiten(returns, mask, eps=eps, unbiased=unbiased)


@register_advantage_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    mask: Tensor | None = None,
    eps: float = 1e-8,
    unbiased: bool = True,
) -> Tensor:
    """REINFORCE++-baseline: r minus its group's mean, then whitened over the batch. (N,) -> (N,)

    Hu et al. 2025 (arXiv:2501.03262), the variant for group sampling: A_i = r_i - mean_g
    removes the prompt's difficulty, then the batch whitening (unbiased variance, eps inside
    the root, as masked_whiten) sets a global scale instead of GRPO's per-group std, which
    would blow up groups whose rewards barely differ. rewards: (N,), the G answers of a
    prompt contiguous; group_size 1 means no baseline (verl: mean 0 for a lone answer).
    Without `mask` every answer weighs the same in the batch mean and variance; with `mask`
    (N, T) each answer weighs its number of valid tokens, which is exactly verl's
    compute_reinforce_plus_plus_baseline_outcome_advantage (it whitens the score broadcast
    to every token). The trainer gives outcome estimators no mask, so it whitens per answer.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    if group_size > 1:
        grouped = grouped - grouped.mean(dim=-1, keepdim=True)
    return whiten_answers(grouped.reshape(-1), mask, eps=eps, unbiased=unbiased)  # (N,)


def whiten_answers(
    values: Tensor, mask: Tensor | None = None, *, eps: float = 1e-8, unbiased: bool = True
) -> Tensor:
    """(v - mean) / sqrt(var + eps) over a batch of answers, masked_whiten's convention: (N,)
    -> (N,). Without `mask` each answer weighs the same; with `mask` (N, T) each weighs its
    number of valid tokens, as whitening the value broadcast to every token does (verl)."""
    # Each answer counts once, or as many times as it has tokens.
    weights = torch.ones_like(values) if mask is None else mask.to(values.dtype).sum(dim=-1)
    # Whitening N values with integer weights w_i is whitening each value repeated w_i times.
    count = weights.sum()
    mean = (values * weights).sum() / count.clamp(min=1)
    dof = (count - 1 if unbiased else count).clamp(min=1)
    var = ((values - mean).square() * weights).sum() / dof
    return (values - mean) * torch.rsqrt(var + eps)  # (N,)


@register_advantage_estimator("grpo_passk")
def grpo_passk_advantages(
    rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Pass@k-optimised GRPO: only each group's best answer gets an advantage. (N,) -> (N,)

    A_best = (r_max - r_second) / (std_g + eps), std unbiased as in GRPO (`scale_by_std=False`
    drops the division), and 0 for every other answer of the group: the gradient of the
    group's max reward, pass@k's outcome, when the k samples are the group (verl's
    `grpo_passk`, compute_grpo_passk_outcome_advantage, citing arXiv:2503.19595). Ties for
    the top give 0. Needs group_size >= 2 (no second best otherwise).
    """
    if group_size < 2:
        raise ValueError(f"grpo_passk needs group_size >= 2, got {group_size}")
    grouped = _grouped(rewards, group_size)  # (n_groups, G)
    top = grouped.topk(2, dim=-1)  # values, indices: (n_groups, 2)
    gap = top.values[:, 0] - top.values[:, 1]  # (n_groups,)
    if scale_by_std:
        gap = gap / (grouped.std(dim=-1) + eps)
    adv = torch.zeros_like(grouped).scatter(1, top.indices[:, :1], gap[:, None])
    return adv.view(-1)  # (N,)


@register_advantage_estimator("gdpo", needs=("components",))
def gdpo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    components: Tensor | None = None,
    mask: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """GDPO: each reward component normalised within its group apart, then summed. (N,) -> (N,)

    components: (N, K), the parts of each answer's reward (format, answer, a judge...; a task
    reports them as reward_info["reward/<name>"], grpo.core.episode.reward_components). Each
    part gets GRPO's group advantage (r_k - mean_k) / (std_k + eps); their sum is whitened
    over the batch (whiten_answers: unbiased variance, 1e-8 inside the root, per answer, or
    per token with `mask` as verl does), so that its scale does not grow with K (Liu et al.
    2026, arXiv:2601.05242; verl's compute_gdpo_outcome_advantage). Summing the rewards
    first (GRPO) maps different mixes of parts to one advantage and lets a part that varies
    widely drown one that varies little. Whatever of `rewards` the parts do not sum to
    (DAPO's overlong penalty, KL in the reward, the reward service's judge score) counts as
    one more part. ValueError when the reward has a single part: GDPO would then be GRPO
    with a batch whitening, not what the run asked for.
    """
    k = 0 if components is None else components.shape[-1]
    if components is None or k < 2:
        raise ValueError(
            f"advantage=gdpo needs a reward of several components, this run's has {max(k, 1)}: "
            "its reward_info must report each as 'reward/<name>' (GSM8K's does), or use grpo"
        )
    parts = components.to(torch.float64)
    rest = rewards.to(torch.float64) - parts.sum(dim=-1)  # (N,)
    if not torch.allclose(rest, torch.zeros_like(rest), atol=1e-5):
        parts = torch.cat([parts, rest[:, None]], dim=-1)  # (N, K + 1)
    total = sum(group_advantages(part, group_size, eps=eps) for part in parts.unbind(dim=-1))
    return whiten_answers(total, mask)  # (N,)


@register_token_advantage_estimator("opd", needs=("teacher",))
def opd_advantages(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    teacher_logp: Tensor | None = None,
    student_logp: Tensor | None = None,
    group_size: int = 1,
    reward_weight: float = 0.0,
) -> Tensor:
    """On-policy distillation: per token, teacher_logp - student_logp, plus reward_weight times
    the task reward's GRPO advantage. (B, T) -> (B, T), 0 on padding.

    student_logp are the behaviour (old) log-probs of the sampled tokens, fixed inputs as any
    advantage: log pi_teacher(y_t) - log pi_old(y_t) is minus the one-sample (k1) estimate of
    the reverse KL(pi_old || pi_teacher) at token t, so the policy gradient lowers the reverse
    KL, mode-seeking (Agarwal et al. 2023, GKD; Thinking Machines' on-policy distillation).
    Tokens the teacher likes more than the student get a positive advantage. With
    reward_weight > 0, each answer's total reward (B,) gets GRPO's group advantage, given to
    every token, added: slime's `--opd-kl-coef 1` on a GRPO advantage scaled by the weight.
    ValueError when either log-prob is missing (no teacher, or no old-policy pass).
    """
    if teacher_logp is None or student_logp is None:
        missing = "no teacher_logp" if teacher_logp is None else "no student_logp"
        raise ValueError(
            f"advantage=opd needs the teacher's and the student's log-probs: {missing}"
        )
    m = mask.to(torch.float32)
    adv = (teacher_logp.float() - student_logp.float()) * m  # (B, T)
    if reward_weight:
        outcome = group_advantages(as_float(token_rewards).sum(dim=-1), group_size)  # (B,)
        adv = adv + reward_weight * broadcast_to_tokens(outcome, m)
    return adv
