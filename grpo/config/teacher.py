"""The teacher section: a model whose per-token log-probs of the student's answers drive
on-policy distillation (algo.advantage: opd, docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from grpo.config.fields import knob

if TYPE_CHECKING:
    from grpo.config.sections import Config

OPD = "opd"  # the advantage estimator that reads the teacher's log-probs


@dataclass
class TeacherConfig:
    path: str = knob(
        "",
        "the teacher's HF model dir, or 'embedded'; '' = no teacher. Its tokenizer must be the "
        "student's (same vocabulary and special tokens), else the sampler refuses to start",
    )
    dtype: Literal["float32", "bfloat16"] = knob("float32", "the teacher's parameter dtype")
    where: Literal["sampler"] = knob(
        "sampler",
        "where the teacher scores the answers: sampler (a small teacher, in each sampler "
        "process, beside the reference model)",
    )


def check_teacher(cfg: Config) -> None:
    """ConfigError, one line, when algo.advantage=opd has no teacher or its weight is bad."""
    from grpo.config.checks import ConfigError  # the checks import the sections, not back

    algo = cfg.algo
    if algo.opd_reward_weight < 0:
        raise ConfigError(f"algo.opd_reward_weight must be >= 0, got {algo.opd_reward_weight!r}")
    if algo.advantage == OPD and not cfg.teacher.path:
        raise ConfigError(
            "algo.advantage=opd needs a teacher: set teacher.path (an HF model dir or "
            "'embedded') whose per-token log-probs the student's answers are scored by"
        )
