"""The trainer's pure parts: reward shaping and advantages over a whole batch, and the update's
mini-batches and optimizer step (in a world of one rank)."""

import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from grpo.algos import (
    adaptive_kl_coef,
    group_advantages,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)
from grpo.config import load_config
from grpo.core.episode import Episode, EpisodeBatch
from grpo.plan import plan_experience, plan_update
from grpo.trainer.experience import shaped_rewards
from tests.experience import build_experience


def compute_advantages(batch, cfg, kl_coef: float = 0.0):
    """Each episode's (C_i,) advantages from the step's experience, and its metrics."""
    exp, metrics = build_experience(batch, plan_experience(cfg), kl_coef)
    lens = [len(e.completion_ids) for e in batch.episodes]
    return [exp.advantages[i, :n] for i, n in enumerate(lens)], metrics


def _batch(rewards, lengths, reasons=None, group_size=2) -> EpisodeBatch:
    reasons = reasons or ["stop"] * len(rewards)
    eps = tuple(
        Episode(
            np.array([1, 2], np.int32), np.arange(n, dtype=np.int32), np.zeros(n, np.float32),
            np.zeros(n, np.float32), float(r), {}, why, i // group_size,
        )
        for i, (r, n, why) in enumerate(zip(rewards, lengths, reasons, strict=True))
    )  # fmt: skip
    return EpisodeBatch(eps, group_size, policy_version=0, seq=0)


def test_overlong_penalty_by_hand():
    got = overlong_penalty(torch.tensor([10, 96, 100, 112, 128, 140]), 128, 32, factor=0.5)
    # over = len - 96, clamped to [0, 32]; penalty = -0.5 * over / 32
    assert torch.allclose(got, torch.tensor([0, 0, -0.0625, -0.25, -0.5, -0.5]))
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), 128, 0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_outcome_advantages_are_broadcast_per_episode(name):
    cfg = load_config(None, [f"algo.advantage={name}"])
    batch = _batch([1.0, 0.0, 0.5, 0.5], [3, 1, 2, 4])
    adv, _ = compute_advantages(batch, cfg)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    expected = {
        "grpo": group_advantages(rewards, 2),
        "dr_grpo": group_advantages(rewards, 2, scale_by_std=False),
        "rloo": rloo_advantages(rewards, 2),
    }[name]
    assert [len(a) for a in adv] == [3, 1, 2, 4]
    for a, e in zip(adv, expected, strict=True):
        assert torch.allclose(a, torch.full_like(a, float(e)))
    assert torch.all(adv[2] == 0) and torch.all(adv[3] == 0)  # equal rewards: no signal


def test_reinforce_pp_whitens_over_the_whole_batch():
    cfg = load_config(None, ["algo.advantage=reinforce_pp", "algo.gamma=0.5"])
    batch = _batch([1.0, 0.0, 0.0, 2.0], [2, 3, 1, 2])
    adv, _ = compute_advantages(batch, cfg)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.float32)
    token_rewards = torch.zeros(4, 3)
    token_rewards[0, 1], token_rewards[3, 1] = 1.0, 2.0
    full = reinforce_pp_advantages(token_rewards, mask, gamma=0.5)
    for i, a in enumerate(adv):
        assert torch.allclose(a, full[i, : len(a)])


def test_dapo_shaping_and_truncation_mask():
    cfg = load_config(
        None,
        ["rollout.max_new_tokens=8", "algo.overlong_buffer=4", "algo.mask_truncated=true",
         "algo.advantage=dr_grpo"],
    )  # fmt: skip
    batch = _batch([1.0, 1.0, 0.0, 0.0], [2, 6, 8, 3], ["stop", "stop", "length", "stop"])
    assert torch.allclose(
        shaped_rewards(batch, plan_experience(cfg)), torch.tensor([1.0, 0.5, -1.0, 0.0])
    )
    adv, _ = compute_advantages(batch, cfg)
    assert torch.allclose(adv[0], torch.full((2,), 0.25))  # 1.0 - mean(1.0, 0.5)
    assert torch.all(adv[2] == 0)  # cut at max_new_tokens: masked out
    assert torch.allclose(adv[3], torch.full((3,), 0.5))


def test_adaptive_kl_coef_by_hand():
    # KL twice the target: error clipped to +0.2; 100 of 1000 samples: coef * 1.02
    assert adaptive_kl_coef(0.1, 0.2, 0.1, 1000, 100) == pytest.approx(0.102)
    # KL at 0.9 of target: error -0.1 -> coef * (1 - 0.1 * 0.1)
    assert adaptive_kl_coef(0.1, 0.09, 0.1, 1000, 100) == pytest.approx(0.099)
    with pytest.raises(ValueError):
        adaptive_kl_coef(0.1, 0.1, 0.0, 1000, 1)


def test_kl_in_reward_is_charged_per_token_and_summed_for_outcome_estimators():
    cfg = load_config(
        None, ["algo.kl_in_reward=true", "algo.kl_reward_kind=k1", "algo.advantage=dr_grpo"]
    )
    first, second = _batch([1.0, 1.0], [2, 3]).episodes
    # old - ref per token (k1): episode 0 pays 0.5 twice, episode 1 pays nothing
    first = replace(first, old_logp=np.full(2, 0.5, np.float32))
    batch = EpisodeBatch((first, second), 2, policy_version=0, seq=0)
    exp, metrics = build_experience(batch, plan_experience(cfg), kl_coef=0.2)
    # the score on the last token
    assert torch.allclose(exp.token_rewards[0, :2], torch.tensor([-0.1, 0.9]))
    assert metrics["rollout_kl_to_ref"] == pytest.approx(1.0 / 5)  # (0.5 + 0.5) / 5 tokens
    adv, _ = compute_advantages(batch, cfg, kl_coef=0.2)
    # outcome totals 0.8 and 1.0 -> Dr. GRPO: -0.1 and +0.1 on every token
    assert torch.allclose(adv[0], torch.full((2,), -0.1)) and torch.allclose(
        adv[1], torch.full((3,), 0.1)
    )


@pytest.fixture
def one_rank():
    """A gloo world of one: the update's collectives then sum and max over this process."""
    import torch.distributed as dist

    from tests.conftest import free_port

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_the_registered_gae_whitened_over_the_batch_equals_the_pure_gae():
    """algo.advantage=gae is a registered estimator that declares the critic's values: the
    plan gives it gamma and lam, and the one place every estimator runs (with_advantages)
    whitens it over the batch's tokens and adds the values back for the critic's targets:
    exactly verl's GAE."""
    from grpo.algos import gae

    torch.manual_seed(0)
    cfg = load_config(None, ["algo.advantage=gae", "algo.gamma=0.9", "algo.lam=0.8",
                             "rollout.questions_per_step=2", "rollout.group_size=2"])  # fmt: skip
    plan = plan_experience(cfg)
    assert plan.advantage.estimator.needs_critic
    batch = _batch([1.0, 0.0, 0.5, 0.5], [3, 1, 2, 4])
    without, _ = build_experience(batch, plan, 0.0)
    values = torch.randn(without.mask.shape) * without.mask
    exp, _ = build_experience(batch, plan, 0.0, values=values)
    ref_adv, ref_returns = gae(exp.token_rewards, values, exp.mask, 0.9, 0.8)
    assert torch.allclose(exp.advantages, ref_adv, atol=1e-6)
    assert torch.allclose(exp.returns, ref_returns, atol=1e-6)
    assert torch.equal(exp.old_values, values)


def test_mini_batches_are_consecutive_rows_once_per_epoch(one_rank):
    from grpo.trainer.step import mini_batches

    cfg = load_config(None, ["train.ppo_epochs=2", "train.mini_batch_size=2",
                             "rollout.questions_per_step=2", "rollout.group_size=2"])  # fmt: skip
    exp, _ = build_experience(_batch([1.0, 0.0, 0.5, 0.5], [3, 1, 2, 4]), plan_experience(cfg), 0.0)
    minis = mini_batches(exp, plan_update(cfg, 1))
    lengths = [[len(c) for c in mini.completions] for mini in minis]
    assert lengths == [[3, 1], [2, 4], [3, 1], [2, 4]]


class RecordingEngine:
    """The part of a DeepSpeed engine optimizer_step uses; records each backward's loss."""

    def __init__(self, micro: int):
        self.micro, self.losses, self.boundaries = micro, [], []

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.micro

    def gradient_accumulation_steps(self) -> int:
        return 1

    def set_gradient_accumulation_boundary(self, last: bool) -> None:
        self.boundaries.append(last)

    def backward(self, loss: torch.Tensor) -> None:
        self.losses.append(float(loss))

    def step(self) -> None:
        """Called after every backward; DeepSpeed applies the optimizer at the boundary only."""


@pytest.mark.parametrize("token_mean", [True, False])
def test_optimizer_step_weights_each_micro_batch_by_its_share(one_rank, token_mean):
    """A loss of 1 per micro-batch shows its weight: its share of the mini-batch's tokens (or
    of its sequences), summing to 1; the accumulation boundary is the last micro-batch."""
    from grpo.trainer.step import optimizer_step

    cfg = load_config(None, ["train.micro_batch_size=2"])
    mini, _ = build_experience(
        _batch([1.0, 0.0, 0.5, 0.5], [3, 1, 2, 4]), plan_experience(cfg), 0.0
    )
    engine = RecordingEngine(micro=2)

    def loss_of(part):
        return torch.tensor(1.0), part.loss_mask, {"metric": torch.tensor(2.0)}

    plan = plan_update(cfg, 1)
    metrics, tokens = optimizer_step(engine, mini, plan, loss_of, mini.loss_mask, token_mean)
    # micro-batches by length: the answers of 1 and 2 tokens, then of 3 and 4
    assert engine.losses == pytest.approx([3 / 10, 7 / 10] if token_mean else [0.5, 0.5])
    assert engine.boundaries == [False, True]
    assert tokens == 10 and float(metrics["metric"]) == pytest.approx(2.0)


def test_mask_truncated_takes_cut_answers_out_of_the_loss():
    batch = _batch([1.0, 0.0], [2, 8], ["stop", "length"])
    on, _ = build_experience(
        batch, plan_experience(load_config(None, ["algo.mask_truncated=true"])), 0.0
    )
    off, _ = build_experience(batch, plan_experience(load_config(None, [])), 0.0)
    assert on.loss_mask.sum(dim=-1).tolist() == [2.0, 0.0]
    assert torch.equal(off.loss_mask, off.mask) and off.mask.sum(dim=-1).tolist() == [2.0, 8.0]


def test_a_stage_of_the_step_is_timed_and_is_the_process_s_phase_meanwhile():
    """The step's one instrumentation: a stage adds its wall time to the step's row and is
    the phase the heartbeats report (and the stall check watches), then the phase before."""
    from grpo.runtime.progress import ACTIVITY, TRAINING, WAITING, Stopwatch

    seconds = Stopwatch()
    ACTIVITY.enter(WAITING, "for a batch")
    with seconds.stage("train_s", TRAINING, "step 3"):
        assert ACTIVITY.snapshot().describe() == "training (step 3)"
        time.sleep(0.01)
    assert ACTIVITY.snapshot().phase == WAITING and seconds["train_s"] >= 0.01


def test_a_column_is_padded_as_each_answer_would_be():
    """pad_answers turns a batch's column (the answers' arrays back to back) into (N, C) in
    one scatter: the same as padding each answer, empty answers and every dtype included."""
    from grpo.core.batching import pad_answers

    answers = [np.array([0.5, -1.0, 2.0], np.float32), np.zeros(0, np.float32),
               np.array([7.0], np.float32), np.array([1.5, 2.5], np.float32)]  # fmt: skip
    lengths = np.array([len(a) for a in answers])
    want = torch.zeros((4, 5))
    for i, a in enumerate(answers):
        want[i, : len(a)] = torch.from_numpy(a)
    flat = np.concatenate(answers)
    flat.setflags(write=False)  # as a received frame's view
    assert torch.equal(pad_answers(flat, lengths, 5), want)
    versions = pad_answers(flat.astype(np.int32), lengths, 5, torch.int64)
    assert versions.dtype == torch.int64 and torch.equal(versions, want.long())
