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
    "none",
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "icepop",
    "seq_masked_tis",
    "decoupled",
]
CORRECTION_MODES: tuple[str, ...] = get_args(CorrectionMode)
BANDED_MODES = ("icepop", "seq_masked_tis")  # the weight modes that read a band too

# Rejection masks that zero tokens or whole answers whose engine-vs-trainer ratio leaves a band
# (grpo.algos.correction); any number of them joins one weight mode in algo.rollout_correction.
RejectionMask = Literal["token_reject", "geo_rs", "token_outlier"]
REJECTION_MASKS: tuple[str, ...] = get_args(RejectionMask)


def parse_correction(spec: str) -> tuple[str, tuple[str, ...]]:
    """algo.rollout_correction ("token_truncate", "icepop+geo_rs", "token_truncate+token_reject",
    ...) -> (its weight mode, "none" when it names none; its rejection masks, in order).
    ValueError naming the part that is neither, or a second weight mode."""
    parts = [p.strip() for p in spec.split("+")]
    modes = [p for p in parts if p in CORRECTION_MODES and p != "none"]
    masks = tuple(p for p in parts if p in REJECTION_MASKS)
    unknown = [p for p in parts if p not in CORRECTION_MODES and p not in REJECTION_MASKS]
    if unknown or (len(parts) > 1 and "none" in parts):
        raise ValueError(
            f"unknown rollout correction {spec!r}: each '+'-joined part is one of "
            f"{[m for m in CORRECTION_MODES if m != 'none']} or {list(REJECTION_MASKS)}"
        )
    if len(modes) > 1 or len(set(masks)) != len(masks):
        raise ValueError(f"rollout correction {spec!r} names a weight mode or a mask twice")
    return (modes[0] if modes else "none"), masks


# The built-in estimator that needs the critic's values (its warm-up is checked with the config;
# the trainer asks the estimator's declared inputs, grpo.algos.registry).
GAE = "gae"
