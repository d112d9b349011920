"""Loss aggregation, KL penalties, the policy losses (PPO/GRPO, GSPO, CISPO, SAPO, GMPO,
Clip-Cov, KL-Cov, DPPO) and the clipped value loss for a critic.

All tensors are (B, T) and aligned with `mask` (1.0 on real response tokens, 0 on padding).
Every policy loss returns `(loss, metrics)`: a scalar tensor to backprop and a dict of 0-d
tensors computed without grad, on the inputs' device (the caller turns them into numbers once
per step: a `.item()` here would wait for the GPU after every micro-batch). Metrics are always
plain token means over valid tokens, whatever aggregation the loss itself uses, so runs with
different `agg` stay comparable.
"""

import torch
from torch import Tensor

from grpo.algos.registry import get_policy_loss, register_policy_loss
from grpo.core.vocabulary import AGG_MODES, KL_KINDS

# exp() of a log-ratio above ~88 overflows float32; anything past e^20 is already saturated by
# the clip, so clamping the exponent only removes inf/NaN, never real signal.
_MAX_LOG_RATIO = 20.0


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over valid tokens: (B, T), (B, T) -> scalar. 0 if nothing is valid."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar.

    token-mean:              sum of all valid tokens / number of valid tokens. Long and short
                             answers weigh the same per token (DAPO).
    seq-mean-token-sum:      per sequence sum over tokens, then mean over the B sequences.
    seq-mean-token-mean:     per sequence mean over tokens, then mean over sequences (original
                             GRPO); every sequence weighs the same, whatever its length.
    seq-mean-token-sum-norm: per sequence sum divided by the constant T (max response length),
                             then mean over sequences (Dr. GRPO): removes the length bias of
                             seq-mean-token-mean without making the scale depend on the batch.
    The seq-mean-* modes average over all B rows, including rows with no valid token (these
    contribute 0). Denominators are clamped to >= 1 so an empty mask gives 0, not NaN.
    """
    mask = mask.to(loss_mat.dtype)
    masked = loss_mat * mask  # (B, T)
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return masked.sum(dim=-1).mean()
    if mode == "seq-mean-token-mean":
        return (masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (masked.sum(dim=-1) / max(mask.shape[-1], 1)).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; valid: {list(AGG_MODES)}")


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by pi: (B, T) -> (B, T).

    k1:  logp - ref_logp                       unbiased, high variance, can be negative.
    k2:  0.5 * (logp - ref_logp)^2             biased, low variance, >= 0.
    k3:  exp(ref - logp) - (ref - logp) - 1    unbiased and >= 0 (Schulman's estimator, used
                                               by GRPO); clamped to [-10, 10] because the exp
                                               explodes when pi puts much less mass than ref.
    abs: |logp - ref_logp|
    """
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp).square()
    if kind == "k3":
        log_r = (ref_logp - logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return (torch.exp(log_r) - log_r - 1).clamp(-10.0, 10.0)
    if kind == "abs":
        return (logp - ref_logp).abs()
    raise ValueError(f"unknown KL penalty {kind!r}; valid: {list(KL_KINDS)}")


def _token_advantages(advantages: Tensor) -> Tensor:
    """Sequence-level advantages (B,) -> (B, 1), broadcasting over tokens; (B, T) unchanged."""
    return advantages[:, None] if advantages.dim() == 1 else advantages


def _ratio_metrics(old_logp: Tensor, logp: Tensor, ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """The metrics every ratio-based loss reports (no grad), token means over valid tokens:
    approx_kl, the k3 estimate of KL(pi_old || pi) on tokens sampled from pi_old
    (exp(logp - old) - (logp - old) - 1: >= 0, low variance), and ratio_mean."""
    with torch.no_grad():
        return {
            "approx_kl": masked_mean(kl_penalty(old_logp, logp.detach(), "k3"), m),
            "ratio_mean": masked_mean(ratio.detach(), m),
        }


def _weighted_agg(loss_mat: Tensor, mask: Tensor, agg: str, weights: Tensor | None) -> Tensor:
    """agg_loss of the per-token losses (B, T), each first scaled by its weight (no gradient)
    when `weights` is given: the rollout correction's importance weights
    (grpo.algos.correction)."""
    if weights is not None:
        loss_mat = loss_mat * weights.detach()
    return agg_loss(loss_mat, mask, agg)


def _clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    logp: Tensor,
    *,
    agg: str,
    clip_low: float,
    clip_high: float,
    clip_c: float | None,
    weights: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO pessimistic surrogate on an importance ratio (B, T), shared by PPO and GSPO.

    `weights` (B, T), without gradient, scale each token's loss before aggregation: the
    rollout correction's importance weights (grpo.algos.correction)."""
    advantages = _token_advantages(advantages)  # sequence-level (B,) are fine too
    pg = -advantages * ratio  # (B, T)
    pg_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    # max of the two losses = min of the two objectives: never profit from moving the ratio
    # outside [1 - clip_low, 1 + clip_high] in the direction the advantage rewards.
    loss_mat = torch.maximum(pg, pg_clipped)  # (B, T)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_c is not None:
        if clip_c <= 1.0:
            raise ValueError(f"dual-clip constant clip_c must be > 1, got {clip_c}")
        # For A < 0 the pessimistic loss -A*ratio grows without bound as the ratio grows
        # (a token the old policy rarely sampled); dual clip caps it at -A*clip_c (Ye et al. 2020).
        cap = -advantages * clip_c
        dual_clipped = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(dual_clipped, cap, loss_mat)
    loss = _weighted_agg(loss_mat, mask, agg, weights)

    with torch.no_grad():
        m = mask.to(ratio.dtype)
        metrics = {
            "clip_frac": masked_mean((pg_clipped > pg).to(m.dtype), m),
            "dual_clip_frac": masked_mean(dual_clipped.to(m.dtype), m),
        }
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("ppo")
@register_policy_loss("grpo")
def ppo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token-level clipped surrogate (PPO, as used by GRPO/DAPO).

    ratio_t = pi(y_t) / pi_old(y_t); clip_high > clip_low is DAPO's "clip-higher", which lets
    low-probability tokens grow faster and keeps entropy from collapsing.
    """
    log_ratio = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    return _clipped_surrogate(
        ratio, advantages, mask, old_logp, logp,
        agg=agg, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, weights=weights,
    )  # fmt: skip


@register_policy_loss("gspo")
def gspo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    clip_c: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025): clip a sequence-level ratio instead of token ratios.

    s_i = exp(mean_t (logp_t - old_logp_t)), the geometric mean of the token ratios: length
    normalised, so its scale does not depend on response length and its clip range is tiny.
    Applied per token as s_it = sg[s_i] * exp(logp_t - sg[logp_t]): its value is s_i but
    d s_it / d logp_t = s_i, so each token gets the sequence's weight with its own gradient
    path. With seq-mean-token-mean this reproduces the paper's gradient exactly
    (d s_i / d logp_t = s_i / |y_i|). The token form also allows token-level advantages.
    The keyword defaults are the paper's, and the only place GSPO's defaults are written (a
    null clip or agg in the config means them).
    """
    mask_f = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * mask_f  # (B, T), zero on padding
    seq_log_ratio = log_ratio.sum(dim=-1) / mask_f.sum(dim=-1).clamp(min=1)  # (B,)
    log_s = seq_log_ratio.detach()[:, None] + logp - logp.detach()  # (B, T), value = seq ratio
    ratio = torch.exp(log_s.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    return _clipped_surrogate(
        ratio, advantages, mask, old_logp, logp,
        agg=agg, clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, weights=weights,
    )  # fmt: skip


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
    weights: Tensor | None = None,
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
    adv = _token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = torch.exp((logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()  # (B, T), stop-gradient
    loss_mat = -weight * adv * logp  # (B, T)
    loss = _weighted_agg(loss_mat, mask, agg, weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        clipped = (ratio > 1.0 + clip_high) | (ratio < 1.0 - clip_low)  # (B, T)
        metrics = {"clip_frac": masked_mean(clipped.to(m.dtype), m)}
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("sapo")
def sapo_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347): a soft gate, no hard clip.

    J = mean_i 1/|y_i| sum_t f(r_it) * A_it with the gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau
    (the paper's objective and gating function), tau = tau_pos where A > 0, else tau_neg.
    f(1) = 2 / tau and f'(r) = 4 s (1 - s) with s = sigmoid(tau * (r - 1)): at r = 1 the
    gradient is exactly the policy gradient, and it fades smoothly (instead of dropping to 0
    at a clip boundary) as the ratio moves away; tau_neg > tau_pos damps negative updates
    faster, which the paper finds more stable. Defaults: the paper's (and verl's) tau_pos 1.0,
    tau_neg 1.05, and seq-mean-token-mean (verl always uses it for `sapo`, whatever its
    loss_agg_mode; here `agg` can change it). Matches verl's `sapo` on the same inputs.
    Metrics: gate_weight_mean (4 s (1 - s), the share of the unclipped gradient A * r * grad
    log pi that a token keeps; 1 on policy), approx_kl, ratio_mean.
    """
    adv = _token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = torch.exp((logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    tau = torch.where(adv > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))  # (B, T)
    s = torch.sigmoid(tau * (ratio - 1.0))  # (B, T)
    loss_mat = -(s * (4.0 / tau)) * adv  # (B, T)
    loss = _weighted_agg(loss_mat, mask, agg, weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        metrics = {"gate_weight_mean": masked_mean(4.0 * s * (1.0 - s), m)}
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("geo_mean")
@register_policy_loss("gmpo")
def geo_mean_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "seq-mean-token-mean",
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Geometric-Mean Policy Optimization, arXiv:2507.20673): geometric mean of token ratios.

    J_i = A_i * exp(1/|o_i| sum_t sgn(A_it) * min(sgn(A_it) * log r_it,
    sgn(A_it) * clip(log r_it, -clip_low, clip_high))) (the paper's GMPO objective, token-level
    clipping in log space): the product of the token ratios to the power 1/|o_i|, so one
    outlier ratio moves the sequence's weight far less than in GRPO's arithmetic mean. The
    clip bounds are on the log-ratio, not on the ratio; the min is PPO's pessimism (a positive
    advantage cannot profit from log r > clip_high, a negative one from log r < -clip_low).
    A_i is the sequence's mean token advantage. Each sequence's loss -J_i is given to all its
    tokens, so the default seq-mean-token-mean is the mean over sequences of -J_i (verl's
    `geo_mean`, which ignores loss_agg_mode); token-mean would weigh sequences by length.
    Defaults: the paper's range (e^-0.4, e^0.4), clip_low = clip_high = 0.4 (verl's GMPO
    example; verl's generic default would be 0.2). `weights` enter per sequence as their
    geometric mean, as in verl. Matches verl's `geo_mean` except that log-ratios are clamped
    to +-20 first (verl leaves that clamp commented out; it matters only past e^20).
    Metrics: clip_frac (tokens whose clipped log-ratio was the one used), approx_kl,
    ratio_mean (of the sequence ratios, per token).
    """
    m = mask.to(logp.dtype)  # (B, T)
    adv = _token_advantages(advantages).expand_as(logp)  # (B, T)
    log_r = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    sign = torch.sign(adv)  # (B, T)
    log_r_clipped = log_r.clamp(-clip_low, clip_high)  # (B, T)
    log_r_used = sign * torch.minimum(sign * log_r, sign * log_r_clipped)  # (B, T)
    length = m.sum(dim=-1).clamp(min=1)  # (B,)
    seq_ratio = torch.exp((log_r_used * m).sum(dim=-1) / length)  # (B,)
    seq_adv = (adv * m).sum(dim=-1) / length  # (B,)
    seq_loss = -seq_adv * seq_ratio  # (B,)
    if weights is not None:
        log_w = torch.log(weights.detach() + 1e-10)  # (B, T)
        seq_loss = seq_loss * torch.exp((log_w * m).sum(dim=-1) / length)
    loss = agg_loss(seq_loss[:, None].expand_as(logp), mask, agg)
    with torch.no_grad():
        used_clip = (log_r_used != log_r) & (sign != 0)  # (B, T)
        metrics = {"clip_frac": masked_mean(used_clip.to(m.dtype), m)}
    return loss, metrics | _ratio_metrics(old_logp, logp, seq_ratio[:, None].expand_as(m), m)


def _clip_cov_choice(candidates: Tensor, n_clip: int) -> Tensor:
    """A (B, T) bool mask of n_clip of the True entries of `candidates`, chosen uniformly at
    random (all of them if there are fewer). Row-major candidates and torch.randperm on the
    default CPU generator, as verl does, so the same seed chooses the same tokens."""
    idx = torch.nonzero(candidates)  # (K, 2)
    chosen = torch.zeros_like(candidates)
    if len(idx):
        idx = idx[torch.randperm(len(idx))[: min(n_clip, len(idx))].to(idx.device)]
        chosen[idx[:, 0], idx[:, 1]] = True
    return chosen


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617, Sec. 4): no gradient for a few high-covariance tokens.

    The entropy change of a softmax policy follows -Cov(log pi(y), A) (the paper's entropy
    dynamics), so tokens with a large positive centred product
    Cov_t = (A_t - mean A) * (log pi_t - mean log pi) (means over the valid tokens) are the ones
    collapsing the entropy. Among the valid tokens that PPO's clip does not already clip and
    whose Cov_t lies in (clip_cov_lb, clip_cov_ub), max(1, int(clip_cov_ratio * n_valid)) are
    drawn at random and get no loss (hence no gradient); every other token has PPO's clipped
    loss max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)). Defaults: verl's (ratio 2e-4,
    bounds (1, 5), clip 0.2, token-mean). Matches verl's `clip_cov` (same draw with the same
    torch seed: torch.randperm on the CPU generator); log-ratios are clamped to +-20 first,
    which verl does not. The choice syncs with the GPU once (the count of candidates).
    Metrics: clip_frac (PPO's clip), cov_clip_frac (tokens detached), approx_kl, ratio_mean.
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    adv = _token_advantages(advantages)  # (B, T) or (B, 1)
    m = mask.to(logp.dtype)  # (B, T)
    valid = mask > 0  # (B, T)
    ratio = torch.exp((logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    pg = -adv * ratio  # (B, T)
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    ppo_clipped = (pg_clipped > pg) & valid  # (B, T)
    with torch.no_grad():
        a, lp = adv.expand_as(logp), logp.detach()
        cov = (a - masked_mean(a, m)) * (lp - masked_mean(lp, m))  # (B, T)
        candidates = valid & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        n_clip = max(int(clip_cov_ratio * float(m.sum())), 1)
        detached = _clip_cov_choice(candidates, n_clip)  # (B, T)
    loss_mat = torch.maximum(pg, pg_clipped).masked_fill(detached, 0.0)  # (B, T)
    loss = _weighted_agg(loss_mat, mask, agg, weights)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean(ppo_clipped.to(m.dtype), m),
            "cov_clip_frac": masked_mean(detached.to(m.dtype), m),
        }
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv:2505.22617, Sec. 4): a KL penalty on the highest-covariance tokens.

    Unclipped surrogate -A r for every token, plus ppo_kl_coef * |log r| on the top
    max(1, int(kl_cov_ratio * n_valid)) valid tokens by Cov_t = (A_t - mean A) *
    (log pi_t - mean log pi) (means over valid tokens): the tokens that drive the entropy
    down are held near the old policy instead of being cut off. No ratio clip at all
    (clip_low / clip_high are not taken). Defaults: verl's configured ones (kl_cov_ratio 2e-4,
    ppo_kl_coef 0.1; its code falls back to 1.0 only when the key is null), token-mean.
    Matches verl's `kl_cov` (ties in Cov may pick different tokens); log-ratios are clamped to
    +-20 first, which verl does not. The choice syncs with the GPU once (the token count).
    Metrics: kl_cov_frac (tokens penalised), approx_kl, ratio_mean.
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    adv = _token_advantages(advantages)  # (B, T) or (B, 1)
    m = mask.to(logp.dtype)  # (B, T)
    valid = mask > 0  # (B, T)
    log_r = (logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_r)  # (B, T)
    with torch.no_grad():
        a, lp = adv.expand_as(logp), logp.detach()
        cov = (a - masked_mean(a, m)) * (lp - masked_mean(lp, m))  # (B, T)
        n_valid = int(valid.sum())
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        if n_valid:
            k = max(1, int(n_valid * kl_cov_ratio))
            top = cov.masked_fill(~valid, -torch.inf).flatten().topk(k).indices  # (k,)
            penalised[top] = True
        penalised = penalised.view_as(valid)  # (B, T)
    loss_mat = -adv * ratio + ppo_kl_coef * log_r.abs() * penalised  # (B, T)
    loss = _weighted_agg(loss_mat, mask, agg, weights)
    with torch.no_grad():
        metrics = {"kl_cov_frac": masked_mean(penalised.to(m.dtype), m)}
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


def _dppo_loss(
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    inside: Tensor,
    *,
    agg: str,
    clip_c: float,
    weights: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's loss once the trust-region mask `inside` (B, T, bool) is known:
    -A * sg(min(r, clip_c)) * log pi on the tokens inside, 0 outside."""
    adv = _token_advantages(advantages)  # (B, T) or (B, 1)
    ratio = torch.exp((logp - old_logp).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # (B, T)
    weight = ratio.clamp(max=clip_c).detach()  # (B, T), truncated IS weight, stop-gradient
    loss_mat = -adv * weight * logp * inside.detach().to(logp.dtype)  # (B, T)
    loss = _weighted_agg(loss_mat, mask, agg, weights)
    m = mask.to(logp.dtype)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean((~inside).to(m.dtype), m),
            "truncated_frac": masked_mean(((ratio > clip_c) & inside).to(m.dtype), m),
        }
    return loss, metrics | _ratio_metrics(old_logp, logp, ratio, m)


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
    weights: Tensor | None = None,
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
    adv = _token_advantages(advantages)
    with torch.no_grad():
        dp = torch.exp(logp.detach()) - torch.exp(old_logp)  # (B, T)
        inside = torch.where(adv > 0, dp <= clip_high, dp >= -clip_low)  # (B, T)
    return _dppo_loss(
        old_logp, logp, advantages, mask, inside, agg=agg, clip_c=clip_c, weights=weights
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
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879): DPPO with a KL trust region.

    As dppo_tv, with the binary KL between Bernoulli(p_old) and Bernoulli(p) (sampled token
    vs the rest of the vocabulary): KL = p_old * log(p_old / p) + (1 - p_old) *
    log((1 - p_old + 1e-8) / (1 - p + 1e-8)). A token is masked out when KL > clip_high and
    p > p_old for A > 0, or KL > clip_low and p < p_old otherwise: moving back toward the old
    policy is always allowed. Defaults: verl's DPPO example for the KL variant (0.05), TIS cap
    clip_c 20, token-mean. Matches verl's `dppo_kl` on the same inputs.
    """
    adv = _token_advantages(advantages)
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
        old_logp, logp, advantages, mask, inside, agg=agg, clip_c=clip_c, weights=weights
    )


def policy_loss(
    name: str,
    old_logp: Tensor,
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **options: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Dispatch to the policy loss `name` (registered, or `package.module:function`).

    `options` (agg, clip_low, clip_high, clip_c, weights) are passed only when not None, so
    that the loss's own defaults (its signature's) apply otherwise; a
    user's loss need not take the ones it has no use for.
    """
    given = {k: v for k, v in options.items() if v is not None}
    return get_policy_loss(name)(old_logp, logp, advantages, mask, **given)


def value_loss(
    values: Tensor,
    returns: Tensor,
    old_values: Tensor,
    mask: Tensor,
    clip: float | None = 0.2,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss for a critic; all inputs (B, T).

    v_clipped = old_values + clamp(values - old_values, -clip, clip) and
    loss_t = 0.5 * max((values - returns)^2, (v_clipped - returns)^2): like the policy clip,
    the max is pessimistic, so the critic cannot profit from moving further than `clip` from
    its rollout-time prediction. clip=None gives the plain 0.5 * (values - returns)^2.
    Aggregated with agg_loss(..., agg). Metrics (token means over valid tokens):
    vf_clip_frac (the clipped error is the larger one), vf_explained_var
    (1 - Var[returns - values] / (Var[returns] + 1e-8), population variances) and value_mean.
    """
    err = (values - returns).square()  # (B, T)
    if clip is None:
        loss_mat = 0.5 * err
        clipped = torch.zeros_like(mask, dtype=torch.bool)
    else:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0 (or None to disable), got {clip}")
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
        err_clipped = (v_clipped - returns).square()  # (B, T)
        loss_mat = 0.5 * torch.maximum(err, err_clipped)
        clipped = err_clipped > err
    loss = agg_loss(loss_mat, mask, agg)

    with torch.no_grad():
        m = mask.to(values.dtype)
        v, ret = values.detach(), returns.detach()

        def masked_var(x: Tensor) -> Tensor:
            return masked_mean((x - masked_mean(x, m)).square(), m)

        metrics = {
            "vf_clip_frac": masked_mean(clipped.to(m.dtype), m),
            # share of the returns' variance the critic accounts for: 1 is perfect, 0 is no
            # better than predicting the mean, negative is worse than that
            "vf_explained_var": (1.0 - masked_var(ret - v) / (masked_var(ret) + 1e-8)),
            "value_mean": masked_mean(v, m),
        }
    return loss, metrics
