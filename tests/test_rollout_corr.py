"""Rollout corrections beside TIS / MIS: IcePop, the token, Geo-RS and token-outlier rejection
masks, and sequence-masked TIS: worked by hand, composed with the weight modes, and against
verl's numbers.

verl's numbers were produced by running verl's own functions (not copies of them) on the fixed
input below, float64, from verl/trainer/ppo/rollout_corr_helper.py at two commits:
- NEW = verl-project/verl @1dda039 (2026-08, the commit test_algos_more.py cites):
  compute_rollout_correction_weights (rollout_is "token" / "sequence", rollout_is_threshold a
  cap, or "lower_upper" for IcePop) times compute_rollout_rejection_mask (rollout_rs
  "token_k1", "seq_mean_k1", "seq_max_k2", "seq_sum_k1" and comma-joined ones): what verl's
  loss multiplies each token by (its presets decoupled_seq_is_rs, decoupled_geo_rs_token_tis).
  volcengine/verl @b178a3cd (2026-01-29) gives the same masks.
- OLD = volcengine/verl @9b718e1a (2026-01-14, before #4544): compute_rollout_rejection_mask
  with rollout_rs "token" / "geometric" / "sequence" and the ratio band as
  rollout_rs_threshold(_lower), and rollout_token_veto_threshold.
NEW's k1 options bound -log(ratio), so its "lower_upper" is the band of pi_rollout / pi_old:
our ratio band [l, h] is its "1/h_1/l" (token_reject's [0.5, 5] is token_k1 "0.2_2.0").
seq_max_k2 with bound u masks answers with any |log ratio| > sqrt(2u): our token_outlier with
the band [e^-sqrt(2u), e^sqrt(2u)].
verl's rejection mask becomes its response_mask (those tokens get no gradient); ours is folded
into the weights (0 = no gradient), so the two are compared token for token. The shares are
verl's rollout_rs_masked_fraction / rollout_rs_seq_masked_fraction (float32 for answers, hence
approx) where verl's mask is the whole of ours, and counted by hand otherwise (said so).
"""

import math

import numpy as np
import pytest
import torch

from grpo.algos import rollout_correction_weights, rollout_rejection

# log(pi_old / pi_rollout) per token, the engine's log-probs, and the answers' tokens
LOG_RATIO = [[0.05, -0.9, 1.8, 0.0], [0.0004, -0.0003, 0.0002, 0.0], [0.3, -0.2, 0.0, 0.0],
             [-10.0, 0.1, 0.1, 0.1], [0.5, 0.4, 0.3, 0.0]]  # fmt: skip
ROLLOUT = [[-0.5, -1.0, -2.5, -0.2], [-0.3, -1.1, -0.7, -0.9], [-1.2, -0.4, -0.8, -0.6],
           [-0.9, -2.0, -0.1, -1.3], [-0.2, -0.6, -1.4, -0.5]]  # fmt: skip
MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]

DROP_ROW_3 = [[1.0] * 4, [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0] * 4, [1.0, 1.0, 1.0, 0]]
ICEPOP = [
    [1.0512710963760241, 0.0, 0.0, 1.0],
    [1.0004000800106678, 0.9997000449955004, 1.0002000200013335, 0.0],
    [1.3498588075760032, 0.8187307530779818, 0.0, 0.0],
    [0.0, 1.1051709180756477, 1.1051709180756477, 1.1051709180756477],
    [1.6487212707001282, 1.4918246976412703, 1.3498588075760032, 0.0],
]
# (our mode, our bands, verl's weights x mask, masked share of tokens, of answers)
VERL = {
    # NEW rollout_is "token", rollout_is_threshold "0.5_5.0" (IcePop); token share = its
    # rollout_is_oob_ratio, answer share (rows 0 and 3) by hand
    "icepop": ("icepop", {"icepop": (0.5, 5.0)}, ICEPOP, 0.1874999998828125, 0.4),
    # NEW token_k1 "0.2_2.0"; OLD rollout_rs="token", threshold 5.0, lower 0.5, the same
    "token_reject": ("token_reject", {"token_reject": (0.5, 5.0)},
                     [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0],
                      [0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]],
                     0.1874999998828125, 0.4000000059604645),
    # NEW seq_mean_k1 "1/1.5_1/0.7"; OLD rollout_rs="geometric", threshold 1.5, lower 0.7
    "geo_rs": ("geo_rs", {"geo_rs": (0.7, 1.5)}, DROP_ROW_3, 0.24999999984375, 0.20000000298023224),
    # NEW seq_max_k2 2.0 (|log ratio| <= 2); OLD rollout_token_veto_threshold=1e-4 drops the
    # same answer (rollout_is_veto_fraction 0.2) but has no upper side
    "token_outlier": ("token_outlier", {"token_outlier": (math.exp(-2.0), math.exp(2.0))},
                      DROP_ROW_3, 0.24999999984375, 0.20000000298023224),
    # NEW decoupled_seq_is_rs: rollout_is "sequence" 2.0 x rollout_rs seq_sum_k1 "0.5_2.0"
    # (Seq-MIS; OLD rollout_rs="sequence" 2.0 / 0.5 masks the same answers)
    "seq_masked_tis": ("seq_masked_tis", {"seq_masked_tis": (0.5, 2.0)},
                       [[0.0] * 4, [1.0003000450045003] * 3 + [0.0],
                        [1.1051709180756475] * 2 + [0.0] * 2, [0.0] * 4, [0.0] * 4],
                       0.6874999995703125, 0.6000000238418579),
    # NEW decoupled_geo_rs_token_tis: rollout_is "token" 2.0 x seq_mean_k1 "1/1.5_1/0.7"
    "token_truncate+geo_rs": ("token_truncate+geo_rs", {"geo_rs": (0.7, 1.5)},
                              [[1.0512710963760241, 0.40656965974059917, 2.0, 1.0], *ICEPOP[1:3],
                               [0.0] * 4, ICEPOP[4]], 0.24999999984375, 0.20000000298023224),
    # NEW rollout_is "token" "0.5_5.0" x seq_mean_k1 "1/1.5_1/0.7"; shares by hand (6 of 16
    # tokens, rows 0 and 3)
    "icepop+geo_rs": ("icepop+geo_rs", {"icepop": (0.5, 5.0), "geo_rs": (0.7, 1.5)},
                      [*ICEPOP[:3], [0.0] * 4, ICEPOP[4]], 0.375, 0.4),
    # NEW rollout_rs "token_k1,seq_mean_k1" "0.2_2.0,1/1.5_1/0.7": every option must pass
    "token_reject+geo_rs": ("token_reject+geo_rs",
                            {"token_reject": (0.5, 5.0), "geo_rs": (0.7, 1.5)},
                            [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0],
                             [0.0] * 4, [1.0, 1.0, 1.0, 0.0]],
                            0.374999999765625, 0.4000000059604645),
}  # fmt: skip


def fixed_input() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rollout = torch.tensor(ROLLOUT, dtype=torch.float64)
    old = rollout + torch.tensor(LOG_RATIO, dtype=torch.float64)
    return old, rollout, torch.tensor(MASK, dtype=torch.float64)


@pytest.mark.parametrize("case", sorted(VERL))
def test_agrees_with_verl(case):
    mode, bands, want, token_share, answer_share = VERL[case]
    old, rollout, mask = fixed_input()
    w, m = rollout_correction_weights(old, rollout, mask, mode, 2.0, bands)
    assert torch.allclose(w, torch.tensor(want, dtype=torch.float64), atol=1e-12)
    assert m["correction_masked_token_frac"] == pytest.approx(token_share, abs=1e-8)
    assert m["correction_masked_seq_frac"] == pytest.approx(answer_share, abs=1e-7)


def test_old_verl_veto_is_token_outlier_without_an_upper_side():
    # OLD rollout_token_veto_threshold=1e-4: a sequence with any ratio below 1e-4 is dropped
    old, rollout, mask = fixed_input()
    w, m = rollout_correction_weights(
        old, rollout, mask, "token_outlier", 2.0, {"token_outlier": (1e-4, 1e30)}
    )
    assert torch.equal(w, torch.tensor(DROP_ROW_3, dtype=torch.float64))
    assert m["correction_token_outlier_seq_frac"] == pytest.approx(0.20000000298023224, abs=1e-7)


def test_icepop_and_token_reject_bands_are_on_the_trainer_over_engine_ratio():
    # an asymmetric band tells the direction: ratio 4 kept, 1/4 dropped by [0.5, 5]; IcePop
    # keeps the ratio as the weight (a threshold of 1 is no matter), token_reject keeps 1
    old = torch.tensor([[math.log(4.0), -math.log(4.0)]])
    args = (old, torch.zeros(1, 2), torch.ones(1, 2))
    w, m = rollout_correction_weights(*args, "icepop", 1.0, {"icepop": (0.5, 5.0)})
    assert torch.allclose(w, torch.tensor([[4.0, 0.0]]))
    assert m == pytest.approx({
        "correction_weight_mean": 2.0,
        "correction_icepop_token_frac": 0.5,
        "correction_icepop_seq_frac": 1.0,
        "correction_masked_token_frac": 0.5,
        "correction_masked_seq_frac": 1.0,
    })  # fmt: skip
    w, m = rollout_correction_weights(*args, "token_reject", 2.0, {"token_reject": (0.5, 5.0)})
    assert w.tolist() == [[1.0, 0.0]] and m["correction_token_reject_token_frac"] == 0.5


def test_geo_rs_ignores_length_where_the_product_does_not():
    # 20 tokens at ratio 1.05: geometric mean 1.05 (kept by [1.045, 1.06]; 1.04 if the 5 padding
    # tokens counted), product 2.65 (dropped by seq_masked_tis's [0.5, 2])
    mask = torch.cat([torch.ones(1, 20), torch.zeros(1, 5)], dim=1)
    old = torch.full((1, 25), math.log(1.05)) * mask + torch.full((1, 25), 3.0) * (1 - mask)
    rollout = torch.zeros(1, 25)
    bands = {"geo_rs": (1.045, 1.06), "seq_masked_tis": (0.5, 2.0)}
    w, _ = rollout_correction_weights(old, rollout, mask, "geo_rs", 2.0, bands)
    assert torch.equal(w, mask)
    w, m = rollout_correction_weights(old, rollout, mask, "seq_masked_tis", 2.0, bands)
    assert torch.equal(w, torch.zeros(1, 25)) and m["correction_seq_masked_tis_seq_frac"] == 1.0


def test_seq_masked_tis_truncates_inside_an_asymmetric_band():
    # product ratios 3 (in [0.5, 4]: capped at the threshold 2), 0.4 (below: dropped), 1.5
    old = torch.tensor([[math.log(3.0), 0.0], [math.log(0.4), 0.0], [math.log(1.5), 0.0]])
    rollout, mask = torch.zeros(3, 2), torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    w, m = rollout_correction_weights(
        old, rollout, mask, "seq_masked_tis", 2.0, {"seq_masked_tis": (0.5, 4.0)}
    )
    assert torch.allclose(w, torch.tensor([[2.0, 2.0], [0.0, 0.0], [1.5, 0.0]]))
    assert m["correction_clipped_frac"] == pytest.approx(1 / 3)  # answers capped
    assert m["correction_masked_seq_frac"] == pytest.approx(1 / 3)  # answers dropped
    assert m["correction_weight_mean"] == pytest.approx((2 + 2 + 1.5) / 5)


def test_token_outlier_drops_the_whole_answer_on_either_side():
    old = torch.tensor([[0.0, 5.0, 0.0], [0.0, -5.0, 0.0], [0.1, -0.1, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # 9.0 is padding
    w, m = rollout_correction_weights(
        old,
        torch.zeros(3, 3),
        mask,
        "token_outlier",
        2.0,
        {"token_outlier": (math.exp(-3), math.exp(3))},
    )
    assert torch.equal(w, torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    assert m["correction_token_outlier_token_frac"] == pytest.approx(6 / 8)
    assert m["correction_token_outlier_seq_frac"] == pytest.approx(2 / 3)


def test_masks_compose_with_every_weight_mode():
    # the mask multiplies what the weight mode alone gives, token for token
    old, rollout, mask = fixed_input()
    bands = {"token_reject": (0.5, 5.0), "icepop": (0.2, 3.0), "seq_masked_tis": (0.5, 2.0)}
    keep, _ = rollout_correction_weights(old, rollout, mask, "token_reject", 2.0, bands)
    modes = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "icepop")
    for mode in (*modes, "seq_masked_tis"):
        alone, base = rollout_correction_weights(old, rollout, mask, mode, 2.0, bands)
        both, m = rollout_correction_weights(old, rollout, mask, f"{mode}+token_reject", 2.0, bands)
        assert torch.equal(both, alone * keep)
        assert m.get("correction_clipped_frac") == base.get("correction_clipped_frac")
        assert m["correction_token_reject_token_frac"] == pytest.approx(0.1875)


def test_huge_ratios_neither_overflow_nor_slip_through():
    old = torch.tensor([[0.0, 0.0, 0.0]])
    rollout = torch.tensor([[-500.0, 0.0, 0.0]])  # ratio e^500: past float32's range
    bands = {"icepop": (0.5, 5.0), "token_reject": (0.5, 5.0), "geo_rs": (0.5, 2.0)}
    bands |= {"token_outlier": (1e-4, 1e4), "seq_masked_tis": (0.5, 2.0)}
    modes = ("icepop", "token_reject", "geo_rs", "token_outlier", "seq_masked_tis")
    for mode in (*modes, "token_truncate+token_reject+geo_rs", "icepop+token_outlier"):
        w, _ = rollout_correction_weights(old, rollout, torch.ones(1, 3), mode, 2.0, bands)
        assert torch.isfinite(w).all() and w[0, 0] == 0


def test_bad_specs_and_bands_are_refused():
    old, rollout, mask = fixed_input()
    for spec, match in [
        ("icepop+bogus", "unknown rollout correction"),
        ("none+icepop", "unknown rollout correction"),
        ("token_mask+sequence_mask", "twice"),
        ("icepop+icepop", "twice"),
    ]:
        with pytest.raises(ValueError, match=match):
            rollout_correction_weights(old, rollout, mask, spec, 2.0, {"icepop": (0.5, 5.0)})
    with pytest.raises(ValueError, match="needs its band"):
        rollout_correction_weights(old, rollout, mask, "geo_rs", 2.0, {"icepop": (0.5, 5.0)})
    with pytest.raises(ValueError, match="0 < low < high"):
        rollout_correction_weights(old, rollout, mask, "geo_rs", 2.0, {"geo_rs": (1.2, 1.1)})
    # masks alone need no threshold > 1: it caps weights, and there are none
    w, _ = rollout_correction_weights(old, rollout, mask, "icepop", 1.0, {"icepop": (0.5, 5.0)})
    assert w.sum() > 0


def test_config_bands_reach_the_weights():
    from grpo.config import ConfigError, load_config

    base = ["rollout.backend=vllm", "algo.rollout_correction=icepop"]
    algo = load_config("configs/cpu_demo.yaml", [*base, "algo.rollout_icepop_band=[0.2, 3]"]).algo
    assert algo.correction_bands()["icepop"] == (0.2, 3.0)
    old = torch.tensor([[math.log(4.0), math.log(0.3)]])
    w, _ = rollout_correction_weights(
        old,
        torch.zeros(1, 2),
        torch.ones(1, 2),
        algo.rollout_correction,
        2.0,
        algo.correction_bands(),
    )
    assert torch.allclose(w, torch.tensor([[0.0, 0.3]]))
    with pytest.raises(ConfigError, match="algo.rollout_icepop_band"):
        load_config("configs/cpu_demo.yaml", [*base, "algo.rollout_icepop_band=[3, 0.2]"])
    with pytest.raises(ConfigError, match="algo.rollout_correction: unknown"):
        load_config("configs/cpu_demo.yaml", ["rollout.backend=vllm", "algo.rollout_correction=x"])
    with pytest.raises(ConfigError, match="rollout.backend=vllm"):
        load_config(
            "configs/cpu_demo.yaml", ["rollout.backend=hf", "algo.rollout_correction=geo_rs"]
        )


def test_the_trainer_applies_the_configured_corrections():
    # build_experience hands the config's bands on; a rejection (token_reject) also takes its
    # tokens out of the loss mask, as verl's response_mask, where IcePop's zeros are weights
    from grpo.config import load_config
    from grpo.core.episode import Episode, EpisodeBatch
    from grpo.plan import plan_experience
    from tests.experience import build_experience

    old = [np.log([4.0, 1.0, 0.3], dtype=np.float32), np.zeros(2, np.float32)]
    eps = tuple(
        Episode(np.array([1, 2], np.int32), np.arange(len(o), dtype=np.int32), o, None, float(i),
                {}, "stop", 0, rollout_logp=np.zeros(len(o), np.float32))
        for i, o in enumerate(old)
    )  # fmt: skip
    batch = EpisodeBatch(eps, 2, 0, 0)
    kept = [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    for mode, loss_mask in [("icepop", [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), ("token_reject", kept)]:
        overrides = ["rollout.backend=vllm", f"algo.rollout_correction={mode}",
                     f"algo.rollout_{mode}_band=[0.5, 3]", "algo.kl_loss_coef=0"]  # fmt: skip
        exp, metrics = build_experience(batch, plan_experience(load_config(None, overrides)), 0.0)
        assert exp.is_weights.tolist() == kept and exp.loss_mask.tolist() == loss_mask
        assert metrics[f"correction_{mode}_token_frac"] == pytest.approx(2 / 5)
        assert metrics["correction_masked_seq_frac"] == pytest.approx(1 / 2)


def test_rejection_is_the_masks_and_seq_masked_tis_band_only():
    old, rollout, mask = fixed_input()
    bands = {"icepop": (0.5, 5.0), "token_reject": (0.5, 5.0), "seq_masked_tis": (0.5, 2.0)}
    ones = torch.ones_like(mask)
    for mode in ("token_truncate", "icepop", "sequence_mask"):
        assert torch.equal(rollout_rejection(old, rollout, mask, mode, bands), ones)
    for mode, name in [
        ("icepop+token_reject", "token_reject"),
        ("seq_masked_tis", "seq_masked_tis"),
    ]:
        w, _ = rollout_correction_weights(old, rollout, mask, name, 2.0, bands)
        kept = rollout_rejection(old, rollout, mask, mode, bands)
        assert torch.equal(kept * mask, (w > 0).to(mask.dtype))  # padding: the mask drops it


# Each band: a spec that uses it, a band of the user's, and the token ratio (pi_old /
# pi_rollout, one token per answer) that the user's band and the default band judge apart.
BAND_CASES = {
    "rollout_icepop_band": ("icepop", "[0.9, 1.1]", 1.35),  # default [0.5, 5] keeps 1.35
    "rollout_token_reject_band": ("token_truncate+token_reject", "[0.9, 1.1]", 1.35),
    "rollout_geo_rs_band": ("token_truncate+geo_rs", "[0.5, 2]", 1.35),  # default drops it
    "rollout_token_outlier_band": ("token_truncate+token_outlier", "[0.9, 1.1]", 1.35),
    "rollout_seq_band": ("seq_masked_tis", "[0.9, 1.1]", 1.35),
}


@pytest.mark.parametrize("key", sorted(BAND_CASES))
def test_every_band_arrives_from_the_config_at_the_trainer(key):
    """The trainer's weights and loss mask (build_experience, as a step computes them) follow
    each band the config sets: a token the default band keeps and the user's drops, or the
    reverse, is treated the other way."""
    from grpo.config import load_config
    from grpo.core.episode import Episode, EpisodeBatch
    from grpo.plan import plan_experience
    from tests.experience import build_experience

    spec, band, ratio = BAND_CASES[key]
    eps = tuple(
        Episode(np.array([1, 2], np.int32), np.arange(1, dtype=np.int32),
                np.array([math.log(r)], np.float32), None, float(i), {}, "stop", 0,
                rollout_logp=np.zeros(1, np.float32))
        for i, r in enumerate([ratio, 1.0])
    )  # fmt: skip
    batch = EpisodeBatch(eps, 2, 0, 0)
    base = ["rollout.backend=vllm", f"algo.rollout_correction={spec}", "algo.kl_loss_coef=0"]

    def kept(*more: str) -> list[float]:
        exp, _ = build_experience(batch, plan_experience(load_config(None, [*base, *more])), 0.0)
        return (exp.is_weights * exp.loss_mask)[:, 0].gt(0).float().tolist()

    default, users = kept(), kept(f"algo.{key}={band}")
    assert default[1] == users[1] == 1.0  # a ratio of 1 is in every band
    assert default[0] != users[0], (key, default, users)
