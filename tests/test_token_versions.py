"""Each token's weights version (continuous generation, issue 31): from the engine's Generation
into the episodes, on the wire as one optional int32 array, validated wherever a batch is built
or received, sliced with its episodes, and into the trainer's per-step lag metrics."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest
import torch

from grpo.config import load_config
from grpo.core.episode import Episode, EpisodeBatch
from grpo.delivery.admission import Expected, misfit
from grpo.plan import plan_experience
from grpo.rollout.base import Generation
from grpo.trainer.experience import token_version_metrics
from grpo.wire.codec import FrameError, decode, encode_batch, seal
from tests.experience import build_experience
from tests.test_episode import (
    assert_batches_identical,
    assert_episodes_identical,
    header_of,
    make_batch,
    received,
)

# --------------------------------------------------------------------------- the wire


def test_token_versions_travel_as_the_last_array_and_lock_step_frames_have_none():
    batch = make_batch(seed=3, versions=True)
    frames = encode_batch(batch)
    assert len(frames) == 7  # header, 5 arrays as before, the versions
    total = len(batch.columns.completion_ids)
    assert header_of(frames)["arrays"][-1] == {
        "name": "token_versions", "dtype": "int32", "count": total,
    }  # fmt: skip
    out = decode(received(frames))
    assert_batches_identical(batch, out)
    assert out.columns.token_versions.dtype == np.dtype("<i4")
    sub = out.select_groups(1, 3)  # a rank's groups: the versions slice with their episodes
    assert_episodes_identical(batch.episodes[4], sub.episodes[0])
    assert sub.columns.token_versions.tolist() == [
        v for e in batch.episodes[4:] for v in e.token_versions.tolist()
    ]
    plain = encode_batch(make_batch(seed=3))  # the same batch without versions: as it was
    assert len(plain) == 6 and "token_versions" not in str(header_of(plain)["arrays"])
    assert all(e.token_versions is None for e in decode(received(plain)).episodes)


def test_versions_on_only_some_answers_are_dropped_for_the_whole_batch():
    batch = make_batch(seed=3, versions=True)
    eps = list(batch.episodes)
    eps[1] = replace(eps[1], token_versions=None)
    mixed = EpisodeBatch(eps, batch.group_size, batch.policy_version, batch.seq)
    assert mixed.columns.token_versions is None
    assert len(encode_batch(mixed)) == 6


def _versioned(versions: list[list[int]], policy_version: int = 3) -> EpisodeBatch:
    eps = [
        Episode(np.array([1, 2], np.int32), np.arange(len(v), dtype=np.int32), None, None,
                float(i), {}, "stop", 0, token_versions=np.array(v, np.int64))
        for i, v in enumerate(versions)
    ]  # fmt: skip
    return EpisodeBatch(eps, len(eps), policy_version, 9)


def test_int64_versions_are_cast_to_int32_and_empty_answers_have_none():
    batch = _versioned([[3, 3, 4], [], [5]])
    assert batch.columns.token_versions.dtype == np.int32
    assert batch.columns.token_versions.tolist() == [3, 3, 4, 5]
    assert [e.token_versions.tolist() for e in batch.episodes] == [[3, 3, 4], [], [5]]


@pytest.mark.parametrize(
    ("versions", "match"),
    [
        ([[3, 4], [2, 5]], "answer 1 has a token of version 2, older than the batch's "
                           "policy_version 3"),
        ([[], [3], [4, 2]], "answer 2 has a token of version 2"),
        ([[3, -1]], r"token_versions holds -1, outside \[0, 2147483647\]"),
        ([[3, 2**32 + 3]], r"token_versions holds 4294967299, outside \[0, 2147483647\]"),
    ],
)  # fmt: skip
def test_a_sampler_never_builds_a_batch_with_impossible_versions(versions, match):
    with pytest.raises(ValueError, match=f"^batch 9 from 'sampler-0': .*{match}"):
        _versioned(versions)


def test_versions_must_be_integers_one_per_token():
    good = _versioned([[3, 3]]).episodes[0]
    for bad, match in [
        (np.array([3.0, 3.0]), "token_versions has dtype float64"),
        (np.array([3], np.int32), "token_versions has length 1, completion_ids has 2"),
    ]:
        with pytest.raises(ValueError, match=match):
            EpisodeBatch([replace(good, token_versions=bad)], 1, 3, 9)


def _frames_with_versions(values: list[int], policy_version: int = 5) -> list[bytes]:
    """A good versioned batch's frames with `values` in its token_versions frame (the last)
    and `policy_version` in its header, resealed: what a broken or hostile peer sends."""
    frames = received(encode_batch(make_batch(seed=3, num_groups=1, group_size=2, versions=True)))
    header = msgpack.unpackb(frames[0][8:], raw=False)
    header["policy_version"] = policy_version
    body = np.array(values, "<i4").tobytes()
    return seal(msgpack.packb(header, use_bin_type=True), [*frames[1:-1], body])


def test_the_trainer_refuses_versions_older_than_the_batch_claims_or_negative():
    n = header_of(_frames_with_versions([]))["arrays"][-1]["count"]
    assert n >= 3
    good = decode(_frames_with_versions([5] * (n - 1) + [9]))
    assert good.columns.token_versions.tolist()[-1] == 9
    for values, policy_version, match in [
        ([5] * (n - 1) + [4], 5, "has a token of version 4, older than the batch's "
                                 "policy_version 5"),
        ([7] * n, 8, "older than the batch's policy_version 8"),
        ([5] * (n - 1) + [-3], 0, "token_versions holds -3, below 0"),
    ]:  # fmt: skip
        with pytest.raises(FrameError, match="^invalid batch: batch 17 from 'sampler-3': ") as e:
            decode(_frames_with_versions(values, policy_version))
        assert match in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FrameError, match=f"array token_versions: {4 * (n + 1)} bytes for {n} x"):
        decode(_frames_with_versions([5] * (n + 1)))


def test_admission_refuses_versions_past_the_last_the_run_publishes():
    batch = make_batch(versions=True)
    newest = int(batch.columns.token_versions.max())
    fits = Expected(groups=3, group_size=4, arrays=frozenset({"old_logp", "ref_logp"}),
                    vocab_size=50_000)  # fmt: skip
    assert misfit(batch, replace(fits, max_version=newest)) is None
    why = misfit(batch, replace(fits, max_version=newest - 1))
    assert why is not None and f"version {newest}" in why and "train.total_steps" in why
    lock_step = make_batch()  # no token versions: its policy_version is checked alone
    assert misfit(lock_step, replace(fits, max_version=lock_step.policy_version)) is None
    why = misfit(lock_step, replace(fits, max_version=lock_step.policy_version - 1))
    assert why is not None and "never publishes for sampling" in why
    cfg = load_config(None, ["train.total_steps=7"])
    assert Expected.for_run(cfg, frozenset(), 100).max_version == 7


# --------------------------------------------------------------------------- the sampler


def test_the_sampler_s_episodes_carry_the_engine_s_versions():
    """BatchMaker.attach_logprobs (log-probs on the trainer: no model) gives each episode its
    generation's versions; the batch's policy_version is its oldest token's (the caller's)."""
    from grpo.sampler.episodes import BatchMaker, Group
    from grpo.tasks.encoding import Prompt

    cfg = load_config(None, ["train.logprobs_on=trainer", "rollout.questions_per_step=1",
                             "rollout.group_size=2"])  # fmt: skip
    rewards = SimpleNamespace(stats=dict)
    weights = SimpleNamespace(version=6, reload_s=0.0, stats=dict)
    tokenizer = SimpleNamespace(pad_token_id=0)
    maker = BatchMaker(
        cfg, tokenizer, rewards, SimpleNamespace(position=0), weights, SimpleNamespace()
    )
    prompt = Prompt(4, {"q": 4}, np.array([5, 6], np.int32))

    def gen(versions: list[int] | None) -> Generation:
        n = 3 if versions is None else len(versions)
        tokens = None if versions is None else np.array(versions, np.int32)
        return Generation(
            prompt.ids,
            np.arange(n, dtype=np.int32) + 7,
            "stop",
            rollout_logp=np.full(n, -0.5, np.float32),
            token_versions=tokens,
        )

    group = Group(prompt, [gen([4, 4, 5]), gen([5, 6])], [(1.0, {}), (0.0, {})])
    batch = maker.batch(0, [group], 4, {"gen_s": 1.0, "gen_tokens": 5.0})
    assert [e.token_versions.tolist() for e in batch.episodes] == [[4, 4, 5], [5, 6]]
    assert batch.policy_version == 4
    assert decode(encode_batch(batch)).columns.token_versions.tolist() == [4, 4, 5, 5, 6]
    lock_step = maker.batch(1, [Group(prompt, [gen(None), gen(None)], group.scored)], 6,
                            {"gen_s": 1.0, "gen_tokens": 6.0})  # fmt: skip
    assert lock_step.columns.token_versions is None


# --------------------------------------------------------------------------- the trainer


def test_token_version_metrics_by_hand():
    versions = torch.tensor([[4, 4, 5, 0], [6, 6, 0, 0], [3, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.float32)
    got = token_version_metrics(versions, mask, current=7)
    # current - version over the 7 valid tokens (row 3's masked 3 is left out)
    lags = [3, 3, 2, 1, 1, -2, -2]
    assert got["token_version_lag_mean"] == pytest.approx(sum(lags) / 7)
    assert got["token_version_lag_max"] == 3
    # row 1 spans 4..5; row 2 one version; row 3 one version once its masked 3 is left out
    assert got["answers_multi_version_share"] == pytest.approx(1 / 3)
    empty_row = torch.zeros(1, 4)
    both = token_version_metrics(versions[:2].clone(), torch.cat([mask[:1], empty_row]), 7)
    assert both["answers_multi_version_share"] == 1.0  # answers with no valid token don't count
    assert token_version_metrics(versions, torch.zeros_like(mask), 7) == {}


def test_the_trainer_s_experience_carries_the_versions_of_the_model_s_tokens():
    eps = [
        Episode(np.array([1, 2], np.int32), np.arange(n, dtype=np.int32), None, None, float(i),
                {}, "stop", 0, token_versions=np.array(v, np.int32), loss_mask=m)
        for i, (n, v, m) in enumerate([
            (3, [2, 3, 3], np.array([1, 0, 1], np.uint8)),  # a tool's token in the middle
            (2, [3, 3], np.ones(2, np.uint8)),
        ])
    ]  # fmt: skip
    batch = EpisodeBatch(eps, 2, 2, 0)
    exp, _ = build_experience(
        batch, plan_experience(load_config(None, ["algo.kl_loss_coef=0"])), 0.0
    )
    assert exp.token_versions.tolist() == [[2, 3, 3], [3, 3, 0]]
    assert exp.rows([1]).token_versions.tolist() == [[3, 3]]
    got = token_version_metrics(exp.token_versions, exp.mask, current=4)
    assert got == {
        "token_version_lag_mean": pytest.approx((2 + 1 + 1 + 1) / 4),
        "token_version_lag_max": 2.0,
        "answers_multi_version_share": 0.5,
    }
    plain, _ = build_experience(
        make_batch(), plan_experience(load_config(None, ["algo.kl_loss_coef=0"])), 0.0
    )
    assert plain.token_versions is None
