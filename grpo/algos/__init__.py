"""GRPO-family algorithm pieces: pure functions of tensors, no config objects, no I/O.

Importing this package registers the built-in policy losses ("ppo", "grpo", "gspo") and
advantage estimators ("grpo", "dr_grpo").
"""

from grpo.algos.advantages import broadcast_to_tokens, dr_grpo_advantages, group_advantages
from grpo.algos.losses import (
    AGG_MODES,
    agg_loss,
    gspo_policy_loss,
    kl_penalty,
    masked_mean,
    policy_loss,
    ppo_policy_loss,
)
from grpo.algos.registry import (
    get_advantage_estimator,
    get_policy_loss,
    register_advantage_estimator,
    register_policy_loss,
)

__all__ = [
    "AGG_MODES",
    "agg_loss",
    "broadcast_to_tokens",
    "dr_grpo_advantages",
    "get_advantage_estimator",
    "get_policy_loss",
    "group_advantages",
    "gspo_policy_loss",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "ppo_policy_loss",
    "register_advantage_estimator",
    "register_policy_loss",
]
