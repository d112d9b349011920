"""Importance-weighted policy gradients: -sg(w) * A * log pi, where the weight w is the
importance ratio pi / pi_old, clipped or truncated, and carries no gradient.

Unlike a clipped surrogate, a token whose ratio leaves the trust region keeps its gradient
(only its weight is capped), unless the loss masks it out explicitly: CISPO clips the
weight, DPPO truncates it and masks the tokens outside a probability-divergence region.
"""

import torch
from torch import Tensor

from grpo.algos.losses.common import (
    clip_ratio,
    masked_mean,
    ratio_metrics,
    token_advantages,
    token_ratio,
    weighted_agg,
)
from grpo.algos.registry import register_policy_loss


@register_policy_loss("cispo")
def cispo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 1.0,
    clip_high: float = 0.2,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, Sec. 3.1): clip the importance weight, not the update.

    J = 1 / sum_i |o_i| * sum_{i,t} sg(r_hat_it) * A_it * log pi(o_it), with
    r_hat_it = clip(r_it, 1 - clip_low, 1 + clip_high) (the paper's CISPO objective and its
    clipped IS weight). The weight carries no gradient, so the gradient is a REINFORCE one,
    -sg(r_hat) * A * grad log pi, for every token: unlike PPO's clip, a clipped token keeps
    its gradient (only its weight is capped), so rare "fork" tokens still learn.
    Defaults: token-mean (the paper's 1 / sum |o_i|); clip_high 0.2 and clip_low 1.0, i.e.
    no lower bound (the paper sets eps_low large and tunes only eps_high; verl's example uses
    clip_ratio_low=10, clip_ratio_high=0.2, the same weights since r > 0). Matches verl's
    `cispo` on the same inputs. Metrics: clip_frac (share of tokens whose weight was capped),
    approx_kl, ratio_mean.
    """
    adv = token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = token_ratio(old_logp, logp)  # (B, T)
    weight = clip_ratio(ratio, clip_low, clip_high).detach()  # (B, T), stop-gradient
    loss_mat = -weight * adv * logp  # (B, T)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        clipped = (ratio > 1.0 + clip_high) | (ratio < 1.0 - clip_low)  # (B, T)
        metrics = {"clip_frac": masked_mean(clipped.to(m.dtype), m)}
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)


def _dppo_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    inside: Tensor,
    *,
    agg: str,
    clip_c: float,
    is_weights: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's loss once the trust-region mask `inside` (B, T, bool) is known:
    -A * sg(min(r, clip_c)) * log pi on the tokens inside, 0 outside."""
    adv = token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = token_ratio(old_logp, logp)  # (B, T)
    weight = ratio.clamp(max=clip_c).detach()  # (B, T), truncated IS weight, stop-gradient
    loss_mat = -adv * weight * logp * inside.detach().to(logp.dtype)  # (B, T)
    loss = weighted_agg(loss_mat, mask, agg, is_weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((~inside).to(m.dtype), m),
            "truncated_frac": masked_mean(((ratio > clip_c) & inside).to(m.dtype), m),
        }
    return loss, metrics | ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("dppo_tv")
def dppo_tv_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.15,
    clip_high: float = 0.15,
    clip_c: float = 20.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
    Learning", arXiv:2602.04879): a trust region on the probability change, not the ratio.

    The paper bounds the total-variation distance between the old and new token distributions;
    the binary approximation (the only one verl implements, and all that the sampled tokens'
    log-probs allow: the full-vocabulary distributions are not kept) splits the vocabulary
    into the sampled token and the rest, where TV = |p - p_old|. A token is masked out when it
    has left the region in the direction its advantage pushes it: p - p_old > clip_high for
    A > 0, p - p_old < -clip_low otherwise. Inside, the loss is the truncated-IS policy
    gradient -A * sg(min(r, clip_c)) * log pi. Unlike the ratio, |p - p_old| is small for
    rare tokens, which PPO's clip over-restricts, and large for likely ones, which it
    under-restricts. Defaults: verl's DPPO example (clip 0.15, token-mean) and verl's TIS cap
    of 20 (clip_c here is that cap, not a dual clip; verl's own actor default clip_ratio_c=3.0
    reaches it unless set, and its example sets 1e4). Matches verl's `dppo_tv` on the same
    inputs. Metrics: clip_frac (tokens masked out), truncated_frac, approx_kl, ratio_mean.
    """
    adv = token_advantages(advantages)
    with torch.no_grad():
        dp = torch.exp(logp.detach()) - torch.exp(old_logp)  # (B, T)
        inside = torch.where(adv > 0, dp <= clip_high, dp >= -clip_low)  # (B, T)
    return _dppo_loss(
        old_logp, logp, advantages, mask, inside, agg=agg, clip_c=clip_c, is_weights=is_weights
    )


@register_policy_loss("dppo_kl")
def dppo_kl_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.05,
    clip_high: float = 0.05,
    clip_c: float = 20.0,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879): DPPO with a KL trust region.

    As dppo_tv, with the binary KL between Bernoulli(p_old) and Bernoulli(p) (sampled token
    vs the rest of the vocabulary): KL = p_old * log(p_old / p) + (1 - p_old) *
    log((1 - p_old + 1e-8) / (1 - p + 1e-8)). A token is masked out when KL > clip_high and
    p > p_old for A > 0, or KL > clip_low and p < p_old otherwise: moving back toward the old
    policy is always allowed. Defaults: verl's DPPO example for the KL variant (0.05), TIS cap
    clip_c 20, token-mean. Matches verl's `dppo_kl` on the same inputs.
    """
    adv = token_advantages(advantages)
    with torch.no_grad():
        lp = logp.detach()
        p, p_old = torch.exp(lp), torch.exp(old_logp)  # (B, T)
        kl = p_old * (old_logp - lp) + (1 - p_old) * torch.log(
            (1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)
        )  # (B, T)
        inside = torch.where(
            adv > 0, (kl <= clip_high) | (p <= p_old), (kl <= clip_low) | (p >= p_old)
        )
    return _dppo_loss(
        old_logp, logp, advantages, mask, inside, agg=agg, clip_c=clip_c, is_weights=is_weights
    )
