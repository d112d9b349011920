"""GDPO: reward components normalised within their groups apart, summed, whitened over the batch.

Checked by hand on the case GRPO cannot tell apart, against a plain float64 loop written here
(never the function under test), against verl's numbers, and through the trainer with GSM8K's
format and answer parts. A reward of one part is refused.
"""

import math

import numpy as np
import pytest
import torch

from grpo.algos import gdpo_advantages, group_advantages
from grpo.config import load_config
from grpo.core.episode import Episode, EpisodeBatch, reward_components
from grpo.plan import plan_experience
from grpo.tasks.gsm8k import reward as gsm8k_reward
from tests.experience import build_experience


def loop_gdpo(parts: list[list[float]], group_size: int) -> list[float]:
    """parts[k][i]: part k of answer i. Plain python, float64."""
    n = len(parts[0])
    total = [0.0] * n
    for part in parts:
        for start in range(0, n, group_size):
            g = part[start : start + group_size]
            mean = sum(g) / len(g)
            std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
            for j, x in enumerate(g):
                total[start + j] += (x - mean) / (std + 1e-6)
    mean = sum(total) / n
    var = sum((x - mean) ** 2 for x in total) / (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in total]


def test_tells_apart_what_grpo_collapses():
    # group 1: both parts right vs none; group 2: one part right vs none. GRPO sees [2, 0] and
    # [1, 0], the same advantages; GDPO gives group 1 twice group 2's.
    parts = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    grpo = group_advantages(parts.sum(-1), 2)
    assert torch.allclose(grpo[:2], grpo[2:])
    got = gdpo_advantages(parts.sum(-1), 2, components=parts)
    assert got[0] == pytest.approx(2 * got[2], rel=1e-5) and got[0] > 0
    assert torch.allclose(got, torch.tensor(loop_gdpo(parts.T.tolist(), 2)), atol=1e-5)


def test_matches_a_plain_loop_on_random_parts():
    torch.manual_seed(0)
    parts = torch.rand(12, 3)
    parts[:, 0] = (parts[:, 0] > 0.5).float()  # a binary part beside two continuous ones
    got = gdpo_advantages(parts.sum(-1), 4, components=parts)
    assert torch.allclose(got, torch.tensor(loop_gdpo(parts.T.tolist(), 4)), atol=1e-5)
    assert got.mean().abs() < 1e-6 and got.std() == pytest.approx(1.0, abs=1e-4)


def test_agrees_with_verl():
    # verl-project/verl @1dda039, verl/trainer/ppo/core_algos.py:
    # compute_gdpo_outcome_advantage, run as is (float32) with gdpo_reward_keys
    # ["format", "answer"], index a,a,a,b,b,b and these answer lengths; it whitens the summed
    # advantage broadcast to every token (masked_whiten), which `mask` reproduces.
    fmt = [0.1, 0.1, 0.0, 0.1, 0.0, 0.0]
    ans = [0.9, 0.0, 0.0, 0.9, 0.9, 0.0]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in [3, 1, 2, 4, 2, 3]])
    verl = [0.946687638759613, -0.14564944803714752, -1.2379697561264038,
            0.9466819763183594, -0.14563824236392975, -1.2379752397537231]  # fmt: skip
    parts = torch.tensor([fmt, ans]).T
    got = gdpo_advantages(parts.sum(-1), 3, components=parts, mask=mask)
    assert torch.allclose(got, torch.tensor(verl), atol=1e-6)


def test_what_the_parts_do_not_sum_to_is_one_more_part():
    # an overlong penalty of -0.5 on answer 1: the rest [0, -0.5, 0, 0] is normalised too
    parts = torch.tensor([[0.1, 0.9], [0.1, 0.0], [0.0, 0.0], [0.1, 0.0]])
    rewards = parts.sum(-1) + torch.tensor([0.0, -0.5, 0.0, 0.0])
    got = gdpo_advantages(rewards, 2, components=parts)
    rest = torch.cat([parts, (rewards - parts.sum(-1))[:, None]], dim=-1)
    assert torch.allclose(got, torch.tensor(loop_gdpo(rest.T.tolist(), 2)), atol=1e-5)
    assert not torch.allclose(got, gdpo_advantages(parts.sum(-1), 2, components=parts))


def test_a_single_part_is_refused_in_one_line():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    for components in (None, torch.zeros(4, 0), rewards[:, None]):
        with pytest.raises(ValueError, match="gdpo needs a reward of several components") as e:
            gdpo_advantages(rewards, 2, components=components)
        assert "\n" not in str(e.value) and "has 1" in str(e.value)


def test_reward_components_from_infos():
    infos = [{"reward/format": 0.1, "reward/answer": 0.9, "pred": "3"}, {"reward_error": "x"}]
    names, values = reward_components(infos)
    assert names == ("answer", "format")
    assert values.tolist() == [[0.9, 0.1], [0.0, 0.0]]  # a failed reward: 0 in every part
    assert reward_components([{}, {"correct": True}])[1].shape == (2, 0)
    with pytest.raises(ValueError, match=r"reward_info\['reward/format'\]"):
        reward_components([{"reward/format": "high"}])


def _gsm8k_batch(answers: list[str], group_size: int, gold: str = "#### 42") -> EpisodeBatch:
    eps = []
    for i, text in enumerate(answers):
        value, info = gsm8k_reward(text, {"question": "q", "answer": gold})
        n = 2 + i % 3
        eps.append(Episode(np.array([1, 2], np.int32), np.arange(n, dtype=np.int32), None, None,
                           value, info, "stop", i // group_size))  # fmt: skip
    return EpisodeBatch(tuple(eps), group_size, policy_version=0, seq=0)


def test_the_trainer_reads_gsm8k_parts():
    # one right answer among unformatted ones, and one formatted-but-wrong: GRPO sees rewards
    # [1, 0, 0, 0] and [0.1, 0, 0, 0], the same advantages; GDPO gives the first twice the
    # second's (both parts moved, not one)
    none = ["no idea"] * 3
    work = "She had 6 boxes of 7 pens each, so she had {} pens.\n#### {}"  # worked answers
    batch = _gsm8k_batch([work.format(42, 42), *none, work.format(7, 7), *none], 4)
    exp, _ = build_experience(
        batch, plan_experience(load_config(None, ["algo.advantage=gdpo"])), 0.0
    )
    parts = torch.tensor([[0.1, 0.9]] + [[0.0, 0.0]] * 3 + [[0.1, 0.0]] + [[0.0, 0.0]] * 3)
    want = gdpo_advantages(parts.sum(-1), 4, components=parts)
    assert torch.allclose(exp.advantages[:, 0], want)
    assert torch.allclose(exp.advantages * exp.mask, want[:, None] * exp.mask)
    assert exp.advantages[0, 0] == pytest.approx(2 * exp.advantages[4, 0], rel=1e-4)
    grpo, _ = build_experience(
        batch, plan_experience(load_config(None, ["algo.advantage=grpo"])), 0.0
    )
    assert grpo.advantages[0, 0] == pytest.approx(grpo.advantages[4, 0], rel=1e-4)


def test_the_trainer_refuses_a_single_part_reward():
    eps = tuple(
        Episode(np.array([1], np.int32), np.arange(2, dtype=np.int32), None, None, float(i), {},
                "stop", i // 2)
        for i in range(4)
    )  # fmt: skip
    with pytest.raises(ValueError, match="advantage=gdpo needs a reward of several components"):
        build_experience(
            EpisodeBatch(eps, 2, 0, 0),
            plan_experience(load_config(None, ["algo.advantage=gdpo"])),
            0,
        )
