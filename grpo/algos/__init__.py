"""GRPO-family algorithm pieces: pure functions of tensors, no config objects, no I/O.

Importing this package registers the built-in policy losses ("ppo", "grpo", "gspo", "cispo",
"sapo", "geo_mean" alias "gmpo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl"), outcome
advantage estimators ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "grpo_passk",
"gdpo") and token advantage estimators ("reinforce_pp", "opd": on-policy distillation, which
also reads the teacher's and the student's log-probs; "gae", which reads the critic's values).
The value loss and GAE's whitened form are plain functions (grpo.algos.value). The losses are
a package, one module per family (grpo.algos.losses).
"""

from grpo.algos.advantages import (
    broadcast_to_tokens,
    dr_grpo_advantages,
    gdpo_advantages,
    group_advantages,
    grpo_passk_advantages,
    masked_whiten,
    opd_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    token_level_rewards,
)
from grpo.algos.correction import logp_abs_diff, rollout_correction_weights, rollout_rejection
from grpo.algos.kl_control import KlControl, adaptive_kl_coef
from grpo.algos.losses import (
    AGG_MODES,
    PolicyLoss,
    agg_loss,
    cispo_policy_loss,
    clip_cov_policy_loss,
    dppo_kl_policy_loss,
    dppo_tv_policy_loss,
    geo_mean_policy_loss,
    gspo_policy_loss,
    kl_cov_policy_loss,
    kl_penalty,
    masked_mean,
    policy_loss,
    ppo_policy_loss,
    sapo_policy_loss,
)
from grpo.algos.registry import (
    get_advantage_estimator,
    get_policy_loss,
    get_token_advantage_estimator,
    register_advantage_estimator,
    register_policy_loss,
    register_token_advantage_estimator,
)
from grpo.algos.shaping import overlong_penalty
from grpo.algos.value import gae, gae_advantages, value_loss
from grpo.core.vocabulary import CORRECTION_MODES, REJECTION_MASKS

__all__ = [
    "CORRECTION_MODES",
    "REJECTION_MASKS",
    "logp_abs_diff",
    "rollout_correction_weights",
    "rollout_rejection",
    "KlControl",
    "adaptive_kl_coef",
    "overlong_penalty",
    "AGG_MODES",
    "PolicyLoss",
    "agg_loss",
    "broadcast_to_tokens",
    "cispo_policy_loss",
    "clip_cov_policy_loss",
    "dppo_kl_policy_loss",
    "dppo_tv_policy_loss",
    "dr_grpo_advantages",
    "gae",
    "gae_advantages",
    "gdpo_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "get_token_advantage_estimator",
    "geo_mean_policy_loss",
    "group_advantages",
    "grpo_passk_advantages",
    "gspo_policy_loss",
    "kl_cov_policy_loss",
    "kl_penalty",
    "masked_mean",
    "masked_whiten",
    "opd_advantages",
    "policy_loss",
    "ppo_policy_loss",
    "register_advantage_estimator",
    "register_policy_loss",
    "register_token_advantage_estimator",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "sapo_policy_loss",
    "token_level_rewards",
    "value_loss",
]
