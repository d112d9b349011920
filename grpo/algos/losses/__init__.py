"""The policy losses, by family, and what they share.

common:     the importance ratio (clamped and clipped in one place each), token aggregation,
            the KL estimators, the metrics, the PolicyLoss contract and the dispatcher.
clipped:    losses of the ratio itself, kept inside a trust region: PPO/GRPO, GSPO, GMPO
            (geo_mean), SAPO (a soft gate).
covariance: Clip-Cov and KL-Cov, which single out the tokens collapsing the entropy.
weighted:   stop-gradient importance weights on log pi: CISPO, DPPO (TV and KL).

Importing the package registers every built-in loss (grpo.algos.registry).
"""

from grpo.algos.losses.clipped import (
    geo_mean_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
    sapo_policy_loss,
)
from grpo.algos.losses.common import (
    AGG_MODES,
    MAX_LOG_RATIO,
    PolicyLoss,
    agg_loss,
    kl_penalty,
    masked_mean,
    policy_loss,
)
from grpo.algos.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss
from grpo.algos.losses.weighted import (
    cispo_policy_loss,
    dppo_kl_policy_loss,
    dppo_tv_policy_loss,
)

__all__ = [
    "AGG_MODES",
    "MAX_LOG_RATIO",
    "PolicyLoss",
    "agg_loss",
    "cispo_policy_loss",
    "clip_cov_policy_loss",
    "dppo_kl_policy_loss",
    "dppo_tv_policy_loss",
    "geo_mean_policy_loss",
    "gspo_policy_loss",
    "kl_cov_policy_loss",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "ppo_policy_loss",
    "sapo_policy_loss",
]
