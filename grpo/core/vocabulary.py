"""The names a config value may take where the algorithms give each its meaning, declared once:
the config's fields are typed by these Literals (and checked against them when a config
loads), and the algorithms validate their arguments against the tuples read from them. Kept
free of torch so that reading a config never imports it."""

from __future__ import annotations

from typing import Literal, get_args

# How token losses are averaged (grpo.algos.losses.common.agg_loss).
AggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
AGG_MODES: tuple[str, ...] = get_args(AggMode)

# Per-token estimators of KL(pi || pi_ref) (grpo.algos.losses.common.kl_penalty).
KlKind = Literal["k1", "k2", "k3", "abs"]
KL_KINDS: tuple[str, ...] = get_args(KlKind)

# Importance weights for the rollout engine's mismatch (grpo.algos.correction).
CorrectionMode = Literal[
    "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]
CORRECTION_MODES: tuple[str, ...] = get_args(CorrectionMode)

# The advantage that is not an estimator function: GAE needs the critic's values.
GAE = "gae"
