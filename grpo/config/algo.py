"""The algorithm section of the config: the policy loss, the advantage estimator, KL, DAPO's
shaping and the rollout correction (moved out of grpo.config.sections for its size; re-exported
there)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.errors import ConfigError
from grpo.config.fields import knob, require_signs
from grpo.core.vocabulary import BANDED_MODES, AggMode, KlKind, parse_correction


@dataclass
class AlgoConfig:
    loss: str = knob(
        "grpo",
        "policy loss: grpo / ppo (token-level clipped ratio), gspo (sequence-level ratio), "
        "cispo (clipped stop-gradient IS weight), sapo (soft gate), geo_mean / gmpo (geometric "
        "mean of token ratios), clip_cov / kl_cov (high-covariance tokens detached / "
        "KL-penalised), dppo_tv / dppo_kl (probability-divergence trust region), see "
        "docs/algorithms.md; or your own as 'package.module:function' (grpo.algos.registry)",
    )
    clip_low: float | None = knob(
        None,
        "ratio >= 1 - clip_low (geo_mean: log-ratio >= -clip_low; dppo_*: the divergence "
        "bound for A <= 0); null = the loss's own default",
    )
    clip_high: float | None = knob(
        None,
        "ratio <= 1 + clip_high (geo_mean: log-ratio <= clip_high; dppo_*: the divergence "
        "bound for A > 0); null = the loss's own default",
    )
    clip_c: float | None = knob(
        None,
        "dual clip for negative advantages: loss capped at -A * clip_c (> 1); dppo_*: the cap "
        "of the stop-gradient ratio; null = the loss's own default (off for ppo)",
    )
    kl_loss_coef: float = knob(0.04, "weight of the KL-to-reference penalty in the loss")
    kl_kind: KlKind = knob("k3", "KL estimator per token")
    advantage: str = knob(
        "grpo",
        "grpo: (r - group mean) / group std; dr_grpo: r - group mean; rloo: leave-one-out "
        "baseline; grpo_passk: only each group's best answer, (r_max - r_second) / group std; "
        "reinforce_pp: discounted return whitened over the batch; reinforce_pp_baseline: "
        "r - group mean, whitened over the batch; gdpo: each reward component (format, answer, "
        "judge...) group-normalised apart, summed, whitened over the batch; opd: on-policy "
        "distillation, per token teacher log-prob - student log-prob (needs teacher.path), "
        "plus opd_reward_weight * the GRPO advantage; gae: PPO with a critic (see the critic "
        "section); or your own estimator as 'package.module:function'",
    )
    opd_reward_weight: float = knob(
        0.0, "opd: weight of the task reward's GRPO advantage added to the teacher's (0 = pure)"
    )
    gamma: float = knob(1.0, "discount of reinforce_pp and gae returns")
    lam: float = knob(0.95, "GAE lambda")
    overlong_buffer: int = knob(
        0, "DAPO: penalise answers in the last N tokens before max_new_tokens (0 = off)"
    )
    overlong_factor: float = knob(1.0, "DAPO: the penalty reached at max_new_tokens")
    mask_truncated: bool = knob(False, "DAPO: answers cut at max_new_tokens get no loss")
    entropy_coef: float = knob(0.0, "entropy bonus: loss -= entropy_coef * mean token entropy")
    kl_in_reward: bool = knob(
        False, "subtract kl_reward_coef * KL(old || ref) per token from the rewards (PPO-style)"
    )
    kl_reward_coef: float = knob(0.001, "initial coefficient of the in-reward KL penalty")
    kl_reward_kind: KlKind = knob(
        "k1", "KL estimator charged in the reward (k1, as verl and OpenRLHF)"
    )
    kl_ctrl: Literal["fixed", "adaptive"] = knob("fixed", "keep the coefficient, or adapt it")
    kl_target: float = knob(0.1, "adaptive controller: the per-token KL to aim for")
    kl_horizon: float = knob(10000.0, "adaptive controller: samples over which to adapt")
    agg: AggMode | None = knob(None, "token-loss averaging; null = the loss's own default")
    rollout_correction: str = knob(
        "none",
        "the rollout engine's numerical mismatch with the trainer, from ratio = pi_old / "
        "pi_rollout: one weight mode and / or rejection masks joined by '+' (e.g. "
        "token_truncate+geo_rs). Weights, per token (token_*) or per answer (sequence_*, the "
        "product): *_truncate caps the weight at the threshold, *_mask drops tokens / answers "
        "whose ratio is outside [1 / threshold, threshold]; icepop: the token's ratio inside "
        "rollout_icepop_band, 0 outside; seq_masked_tis: sequence_truncate with answers "
        "outside rollout_seq_band dropped; decoupled: AReaL's decoupled PPO, the old "
        "log-probs as the proximal policy and each token weighted by pi_old / pi_rollout of "
        "the weights that sampled it, 0 above the threshold (AReaL's behav_imp_weight_cap). "
        "Masks (weight 0, no gradient): token_reject drops "
        "tokens outside rollout_token_reject_band, geo_rs answers whose geometric mean ratio "
        "is outside rollout_geo_rs_band, token_outlier answers with any token outside "
        "rollout_token_outlier_band. Needs rollout.backend: vllm; see docs/algorithms.md",
    )
    rollout_correction_threshold: float = knob(
        2.0,
        "the cap / band of rollout_correction's *_truncate / *_mask weights, and decoupled's "
        "cap (> 1)",
    )
    rollout_icepop_band: list[float] = knob(
        [0.5, 5.0], "icepop: token ratios kept, [low, high] (IcePop's 0.5, 5)"
    )
    rollout_token_reject_band: list[float] = knob(
        [0.5, 2.0], "token_reject: token ratios kept, [low, high]"
    )
    rollout_geo_rs_band: list[float] = knob(
        [0.999, 1.001], "geo_rs: geometric mean ratios kept, [low, high] (verl's default)"
    )
    rollout_token_outlier_band: list[float] = knob(
        [0.0001, 10000.0], "token_outlier: answers kept when every token ratio is in [low, high]"
    )
    rollout_seq_band: list[float] = knob(
        [0.5, 2.0], "seq_masked_tis: answer (product) ratios kept, [low, high] (verl's Seq-MIS)"
    )

    def correction_bands(self) -> dict[str, tuple[float, float]]:
        """The [low, high] of each band rollout_correction may name
        (grpo.algos.correction.rollout_correction_weights's `bands`)."""
        pairs = {
            "icepop": self.rollout_icepop_band,
            "token_reject": self.rollout_token_reject_band,
            "geo_rs": self.rollout_geo_rs_band,
            "token_outlier": self.rollout_token_outlier_band,
            "seq_masked_tis": self.rollout_seq_band,
        }
        return {name: (float(b[0]), float(b[1])) for name, b in pairs.items()}


def check_algo(algo: AlgoConfig) -> None:
    require_signs("algo", algo, (), ("overlong_factor", "kl_loss_coef", "entropy_coef"))
    for key in ("clip_low", "clip_high"):
        value = getattr(algo, key)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"algo.{key} must be in [0, 1) or null, got {value!r}")
    if algo.clip_c is not None and algo.clip_c <= 1:
        raise ConfigError(f"algo.clip_c must be > 1 or null, got {algo.clip_c!r}")
    if not 0 < algo.gamma <= 1 or not 0 <= algo.lam <= 1:
        raise ConfigError(
            f"algo.gamma must be in (0, 1] and algo.lam in [0, 1], got {algo.gamma!r}, {algo.lam!r}"
        )
    if algo.kl_reward_coef < 0 or algo.kl_target <= 0 or algo.kl_horizon <= 0:
        raise ConfigError("algo.kl_reward_coef must be >= 0, kl_target and kl_horizon > 0")
    if algo.kl_ctrl == "adaptive" and not (algo.kl_in_reward and algo.kl_reward_coef):
        raise ConfigError(
            "algo.kl_ctrl=adaptive adapts the in-reward KL coefficient: it needs "
            "algo.kl_in_reward=true and algo.kl_reward_coef > 0"
        )


def check_correction(algo: AlgoConfig, engine_logprobs: bool) -> None:
    """algo.rollout_correction's parts, its threshold when it weights and the bands it names:
    ConfigError, one line naming the key, for anything unusable (grpo.config.rules: it reads
    the engine's abilities).
    `engine_logprobs`: whether the run's rollout engine reports its log-probs."""
    spec = algo.rollout_correction
    try:
        mode, masks = parse_correction(spec)
    except ValueError as e:
        raise ConfigError(f"algo.rollout_correction: {e}") from None
    if mode == "none" and not masks:
        return
    if not engine_logprobs:
        raise ConfigError(
            f"algo.rollout_correction={spec} needs the rollout engine's log-probs: set "
            "rollout.backend=vllm or rollout.mode=continuous (lock-step hf reports none)"
        )
    threshold = algo.rollout_correction_threshold
    if mode not in ("none", "icepop") and threshold <= 1:
        raise ConfigError(f"algo.rollout_correction_threshold must be > 1, got {threshold!r}")
    keys = {"seq_masked_tis": "rollout_seq_band"}
    for name in masks + ((mode,) if mode in BANDED_MODES else ()):
        key = keys.get(name, f"rollout_{name}_band")
        band = getattr(algo, key)
        if len(band) != 2 or not 0 < band[0] < band[1]:
            raise ConfigError(f"algo.{key} must be [low, high] with 0 < low < high, got {band!r}")
