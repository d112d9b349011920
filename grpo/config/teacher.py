"""The teacher section: a model whose per-token log-probs of the student's answers drive
on-policy distillation (algo.advantage: opd, docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from grpo.config.fields import knob

if TYPE_CHECKING:
    from grpo.config.sections import Config

OPD = "opd"  # the advantage estimator that reads the teacher's log-probs
SAMPLER, SERVICE = "sampler", "service"


@dataclass
class TeacherConfig:
    path: str = knob(
        "",
        "the teacher's HF model dir, or 'embedded'; '' = no teacher. Its tokenizer must be the "
        "student's (same vocabulary and special tokens), else the sampler refuses to start "
        "(where: service: the first request is refused and the sampler stops)",
    )
    dtype: Literal["float32", "bfloat16"] = knob("float32", "the teacher's parameter dtype")
    where: Literal["sampler", "service"] = knob(
        "sampler",
        "where the teacher scores the answers: sampler (a small teacher, in each sampler "
        "process, beside the reference model) or service (a large one, in the reward service "
        "at reward.service_addr: ROLE=reward loads it and every sampler asks it)",
    )
    max_tokens: int = knob(
        8192,
        "where: service: the longest prompt + answer (tokens) the service's teacher scores; a "
        "request holding a longer one is refused",
    )


def serves_teacher(cfg: Config) -> bool:
    """Whether the reward service (ROLE=reward) loads the teacher and serves its log-probs."""
    return bool(cfg.teacher.path) and cfg.teacher.where == SERVICE


def service_scores(cfg: Config) -> bool:
    """Whether the samplers ask the reward service for scores: whenever reward.service_addr is
    set, except for a service that serves the teacher alone (no reward_server.backend)."""
    return bool(cfg.reward.service_addr) and (
        bool(cfg.reward_server.backend) or not serves_teacher(cfg)
    )


def check_teacher(cfg: Config) -> None:
    """ConfigError, one line, when algo.advantage=opd has no teacher or its weight is bad, or
    a served teacher has no service to run in."""
    from grpo.config.checks import ConfigError  # the checks import the sections, not back

    algo, t = cfg.algo, cfg.teacher
    if algo.opd_reward_weight < 0:
        raise ConfigError(f"algo.opd_reward_weight must be >= 0, got {algo.opd_reward_weight!r}")
    if algo.advantage == OPD and not t.path:
        raise ConfigError(
            "algo.advantage=opd needs a teacher: set teacher.path (an HF model dir or "
            "'embedded') whose per-token log-probs the student's answers are scored by"
        )
    if t.max_tokens < 2:
        raise ConfigError(f"teacher.max_tokens must be >= 2, got {t.max_tokens!r}")
    if t.where == SERVICE and t.path and not cfg.reward.service_addr:
        raise ConfigError(
            "teacher.where=service needs reward.service_addr: the reward service (ROLE=reward) "
            "that loads teacher.path and that the samplers ask, e.g. tcp://teacher-node:5560"
        )
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if serves_teacher(cfg) and t.max_tokens < longest:
        raise ConfigError(
            f"teacher.max_tokens={t.max_tokens} is below data.max_prompt_tokens + "
            f"rollout.max_new_tokens ({longest}): the service would refuse the longest answers"
        )
