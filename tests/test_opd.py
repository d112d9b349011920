"""On-policy distillation (algo.advantage: opd): the estimator's maths on fixed inputs, the
teacher's log-probs on the wire (carried, validated, refused when malformed), the config's and
the tokenizer's refusals, and a short real run whose metrics show the reverse KL."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import msgpack
import numpy as np
import pytest
import torch

from grpo.algos import opd_advantages
from grpo.algos.registry import get_estimator
from grpo.config import ConfigError, load_config
from grpo.config.passes import scoring_passes
from grpo.core.episode import Episode, EpisodeBatch
from grpo.models.embedded import ModelError
from grpo.models.loading import load_tokenizer
from grpo.plan import plan_experience
from grpo.scoring.teacher import check_same_tokenizer, load_teacher, tokenizer_difference
from grpo.wire.codec import FrameError, decode, encode_batch, seal
from tests.conftest import run_launch, transport_overrides
from tests.experience import build_experience

OPD = ["algo.advantage=opd", "teacher.path=/some/teacher"]

# --------------------------------------------------------------------------- the estimator

TEACHER = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -3.0, -9.0]])
STUDENT = torch.tensor([[-1.5, -1.0, -4.0], [-0.5, -1.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
REWARDS = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # answer totals 1 and 0


def test_pure_opd_is_teacher_minus_student_on_the_answer_tokens():
    adv = opd_advantages(REWARDS, MASK, teacher_logp=TEACHER, student_logp=STUDENT, group_size=2)
    # 0 on padding, whatever the log-probs there; the reward plays no part at weight 0.
    assert torch.equal(adv, torch.tensor([[0.5, -1.0, 0.0], [0.0, -2.0, -7.0]]))


def test_the_reward_s_grpo_advantage_is_added_with_its_weight():
    adv = opd_advantages(
        REWARDS, MASK, teacher_logp=TEACHER, student_logp=STUDENT, group_size=2, reward_weight=0.5
    )
    # GRPO on totals [1, 0]: mean 0.5, unbiased std 1/sqrt(2): +-0.5 * sqrt(2) (eps 1e-6)
    grpo = 0.5 / (1 / math.sqrt(2) + 1e-6)
    want = torch.tensor([[0.5, -1.0, 0.0], [0.0, -2.0, -7.0]]) + 0.5 * torch.tensor(
        [[grpo, grpo, 0.0], [-grpo, -grpo, -grpo]]
    )
    assert torch.allclose(adv, want)


def test_opd_is_a_registered_token_estimator_and_needs_both_log_probs():
    estimator = get_estimator("opd")
    assert estimator.fn is opd_advantages and estimator.token_level
    assert estimator.needs == ("teacher",)
    with pytest.raises(ValueError, match="no teacher_logp"):
        opd_advantages(REWARDS, MASK, student_logp=STUDENT)


def _batch(teacher: bool = True, group_size: int = 2) -> EpisodeBatch:
    """Two groups of two answers with old and teacher log-probs of fixed values."""
    eps = []
    for i, (n, reward) in enumerate(zip([2, 3, 1, 2], [1.0, 0.0, 0.5, 0.5], strict=True)):
        eps.append(
            Episode(
                np.array([1, 2], np.int32), np.arange(n, dtype=np.int32),
                np.full(n, -1.0, np.float32), None, reward, {}, "stop", i // group_size,
                teacher_logp=np.full(n, -1.0 + 0.25 * (i + 1), np.float32) if teacher else None,
            )
        )  # fmt: skip
    return EpisodeBatch(eps, group_size, 0, 0)


def test_the_trainer_s_experience_takes_opd_advantages_and_reports_the_reverse_kl():
    cfg = load_config(None, [*OPD, "rollout.questions_per_step=2", "rollout.group_size=2"])
    exp, metrics = build_experience(_batch(), plan_experience(cfg), 0.0)
    for i, n in enumerate([2, 3, 1, 2]):
        assert torch.allclose(exp.advantages[i, :n], torch.full((n,), 0.25 * (i + 1)))
        assert not exp.advantages[i, n:].any()
    # teacher - old per token: 0.25 x2, 0.5 x3, 0.75, 1.0 x2 over 8 tokens
    mean = (0.5 + 1.5 + 0.75 + 2.0) / 8
    assert metrics["opd_reverse_kl"] == pytest.approx(-mean)
    assert metrics["opd_advantage_mean"] == pytest.approx(mean)
    with pytest.raises(ValueError, match="no teacher_logp"):
        build_experience(_batch(teacher=False), plan_experience(cfg), 0.0)


def test_the_trainer_adds_the_reward_advantage_with_the_configured_weight():
    """algo.opd_reward_weight reaches build_experience: teacher - old per token plus the weight
    times GRPO's advantage of the answer's reward, by hand."""
    overrides = [*OPD, "rollout.questions_per_step=2", "rollout.group_size=2",
                 "algo.opd_reward_weight=0.5"]  # fmt: skip
    exp, _ = build_experience(_batch(), plan_experience(load_config(None, overrides)), 0.0)
    # group 0: rewards 1, 0 -> +-1/(1/sqrt(2) + 1e-6); group 1: 0.5, 0.5 -> 0 (flat)
    grpo = 1 / (1 / math.sqrt(2) + 1e-6) / 2
    for i, (n, g) in enumerate(zip([2, 3, 1, 2], [grpo, -grpo, 0.0, 0.0], strict=True)):
        want = torch.full((n,), 0.25 * (i + 1) + 0.5 * g)
        assert torch.allclose(exp.advantages[i, :n], want, atol=1e-6), (i, exp.advantages[i])


def test_the_sampler_asks_the_teacher_at_the_sampling_temperature(tiny_model_dir):
    """The sampler's teacher log-probs (BatchMaker.teacher_scores) are the teacher's
    log_softmax(logits / T) at rollout.temperature, as the old log-probs are, by hand."""
    from grpo.models.loading import load_reference
    from grpo.rollout.base import Generation, Sampling
    from grpo.sampler.episodes import BatchMaker
    from grpo.scoring.teacher import InProcessTeacher

    cfg = load_config(None, [*OPD, "rollout.temperature=0.6"])
    teacher = load_reference(tiny_model_dir)
    maker = BatchMaker.__new__(BatchMaker)  # only what teacher_scores reads
    maker.sampling = Sampling.from_config(cfg)
    maker.teacher = InProcessTeacher(teacher, pad_id=0, batch_size=4, packed=False)
    prompt, answer = np.array([5, 9, 13], np.int32), np.array([21, 8, 40, 7], np.int32)
    got = maker.teacher_scores([Generation(prompt, answer, "stop")])[0]
    with torch.no_grad():
        logits = teacher(torch.as_tensor(np.concatenate([prompt, answer]))[None].long()).logits
    logp = (logits[0, 2:-1].float() / 0.6).log_softmax(-1)
    ids = torch.as_tensor(answer).long()[:, None]
    want = logp.gather(-1, ids)[:, 0]
    assert np.allclose(got, want.numpy(), atol=1e-4), (got, want)
    at_one = logits[0, 2:-1].float().log_softmax(-1).gather(-1, ids)[:, 0]
    assert not np.allclose(got, at_one.numpy(), atol=1e-3)  # T matters for this model


# --------------------------------------------------------------------------- the config


def test_opd_without_a_teacher_or_with_a_negative_weight_is_refused():
    with pytest.raises(ConfigError, match="algo.advantage=opd needs a teacher: set teacher.path"):
        load_config(None, ["algo.advantage=opd"])
    with pytest.raises(ConfigError, match="algo.opd_reward_weight must be >= 0"):
        load_config(None, [*OPD, "algo.opd_reward_weight=-1"])


def test_opd_reads_the_old_log_probs_so_the_old_pass_runs():
    """With one step per batch the old log-probs would be the training forward's, too late
    for the advantages (grpo.config.passes)."""
    one_step = ["train.max_staleness=0", "algo.kl_loss_coef=0"]
    assert not scoring_passes(load_config(None, one_step)).old
    assert scoring_passes(load_config(None, [*one_step, *OPD])).old


# --------------------------------------------------------------------------- the tokenizer


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(base_model_dir, tmp_path):
    student = load_tokenizer(base_model_dir)
    assert tokenizer_difference(student, load_tokenizer(base_model_dir)) is None
    check_same_tokenizer(student, load_tokenizer(base_model_dir), "student", "teacher")

    more_words = load_tokenizer(base_model_dir)
    more_words.add_tokens(["distillation-only-word"])
    assert "vocabularies differ" in tokenizer_difference(student, more_words)

    other_eos = load_tokenizer(base_model_dir)
    other_eos.eos_token = "<|endoftext|>" if student.eos_token != "<|endoftext|>" else "<|im_end|>"
    with pytest.raises(ModelError) as refused:
        check_same_tokenizer(student, other_eos, "/models/student", "/models/teacher")
    line = str(refused.value)
    assert "\n" not in line and "'/models/teacher'" in line and "'/models/student'" in line
    assert "special token eos_token" in line


def test_the_sampler_s_teacher_is_loaded_only_with_the_student_s_tokenizer(
    tiny_model_dir, tmp_path
):
    """load_teacher, what the sampler calls at start: the same tokenizer loads the teacher
    (in teacher.dtype); one with an extra token is refused before its weights are read."""
    from tests.tiny_model import build_tiny_model

    student = load_tokenizer(tiny_model_dir)
    cfg = load_config(None, [*OPD[:1], f"teacher.path={tiny_model_dir}", "teacher.dtype=bfloat16"])
    teacher = load_teacher(cfg, student, tiny_model_dir, torch.device("cpu"))
    assert next(teacher.parameters()).dtype == torch.bfloat16 and not teacher.training
    assert load_teacher(load_config(None, []), student, tiny_model_dir, torch.device("cpu")) is None

    other = build_tiny_model(tmp_path / "other", tiny_model_dir, seed=2)
    tok = load_tokenizer(other)
    tok.add_tokens(["<teacher-only>"])
    tok.save_pretrained(other)
    cfg = load_config(None, [*OPD[:1], f"teacher.path={other}"])
    with pytest.raises(ModelError, match=f"teacher.path '{other}' has another tokenizer"):
        load_teacher(cfg, student, tiny_model_dir, torch.device("cpu"))
    cfg = load_config(None, [*OPD[:1], f"teacher.path={tmp_path / 'nowhere'}"])
    with pytest.raises(ModelError, match="^teacher.path .* is not an HF model dir"):
        load_teacher(cfg, student, tiny_model_dir, torch.device("cpu"))


# --------------------------------------------------------------------------- the wire


def test_teacher_log_probs_travel_and_are_absent_without_a_teacher():
    sent = _batch()
    got = decode(encode_batch(sent))
    for a, b in zip(sent.episodes, got.episodes, strict=True):
        assert a.teacher_logp.tobytes() == b.teacher_logp.tobytes()
    plain = decode(encode_batch(_batch(teacher=False)))
    assert all(e.teacher_logp is None for e in plain.episodes)
    names = [d["name"] for d in msgpack.unpackb(bytes(encode_batch(sent)[0])[8:])["arrays"]]
    assert names[-1] == "teacher_logp"


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (np.zeros(9, np.float32), "teacher_logp has length 9"),
        (np.zeros(2, np.int32), "teacher_logp has dtype int32"),
        (np.array([np.nan, 0.0], np.float32), "teacher_logp holds nan"),
        (np.array([-1e30, 0.0], np.float32), "teacher_logp holds"),
    ],
)
def test_a_sampler_never_builds_a_batch_with_malformed_teacher_log_probs(bad, match):
    eps = list(_batch().episodes)
    eps[0] = replace(eps[0], teacher_logp=bad)
    with pytest.raises(ValueError, match=match):
        EpisodeBatch(eps, 2, 0, 0)


def _frames_with_teacher(values: np.ndarray, count: int | None = None) -> list[bytes]:
    """A good batch's frames whose teacher_logp frame (the last) is `values`, its descriptor
    claiming `count` values, resealed: what a hostile or broken peer sends."""
    frames = [bytes(f) for f in encode_batch(_batch())]
    header = msgpack.unpackb(frames[0][8:], raw=False)
    header["arrays"][-1]["count"] = len(values) if count is None else count
    return seal(msgpack.packb(header, use_bin_type=True), [*frames[1:-1], values.tobytes()])


def test_the_trainer_refuses_malformed_teacher_log_probs_from_the_wire():
    good = decode(_frames_with_teacher(np.full(8, -0.5, np.float32)))
    assert good.episodes[3].teacher_logp.tolist() == [-0.5, -0.5]
    with pytest.raises(FrameError, match="teacher_logp: 28 bytes for 8 x float32"):
        decode(_frames_with_teacher(np.zeros(7, np.float32), count=8))
    with pytest.raises(FrameError, match="teacher_logp: completion_len does not sum to 9"):
        decode(_frames_with_teacher(np.zeros(9, np.float32)))
    with pytest.raises(FrameError, match="teacher_logp holds inf"):
        decode(_frames_with_teacher(np.array([0, 0, 0, np.inf, 0, 0, 0, 0], np.float32)))


# --------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_two_step_opd_run_reports_the_reverse_kl(tmp_path, tiny_model_dir, base_model_dir):
    """The tiny model distilled from another tiny model (other weights, same tokenizer): the
    sampler scores every answer with the teacher, the trainer's metrics carry the reverse KL
    and the OPD advantage, both non-zero, their sum zero (pure OPD)."""
    from tests.test_integration import tiny_config
    from tests.tiny_model import build_tiny_model

    teacher = build_tiny_model(tmp_path / "teacher", base_model_dir, seed=1)
    config = tiny_config(
        tmp_path, tiny_model_dir,
        train={"total_steps": 2, "num_ranks": 1},
        algo={"advantage": "opd", "kl_loss_coef": 0.0},
        teacher={"path": str(teacher)},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # Two random models disagree, a little (both are near uniform over the vocabulary): a
        # one-sample estimate over ~200 tokens, of either sign, but never 0 as it would be if
        # the student scored its own answers.
        assert 1e-4 < abs(r["opd_reverse_kl"]) < 1, r
        assert r["opd_advantage_mean"] == pytest.approx(-r["opd_reverse_kl"], abs=1e-4), r
