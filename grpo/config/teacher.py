"""The teacher section: a model whose per-token log-probs of the student's answers drive
on-policy distillation (algo.advantage: opd, docs/algorithms.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo.config.fields import knob

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
