"""The run's OPD teacher as the sampler asks it: in this process (grpo.scoring.teacher) or in
the reward service (grpo.reward_service.client.RemoteTeacher), one interface. Here, above both
packages, so that scoring never imports the reward service."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from grpo.config import Config
from grpo.reward_service.client import RemoteTeacher
from grpo.scoring.teacher import (
    InProcessTeacher,
    TeacherScorer,
    load_teacher,
    tokenizer_fingerprint,
)


def teacher_scorer(
    cfg: Config,
    student: PreTrainedTokenizerBase,
    student_path: Path,
    device: torch.device,
    service_client=None,
) -> TeacherScorer | None:
    """The run's teacher as the sampler asks it: None without teacher.path; with
    teacher.where: service, the reward service's (through `service_client`, a RewardClient);
    else loaded here (load_teacher)."""
    if not cfg.teacher.path:
        return None
    if cfg.teacher.where == "service":
        if service_client is None:
            raise ValueError("teacher.where=service needs reward.service_addr")
        return RemoteTeacher(service_client, tokenizer_fingerprint(student))
    model = load_teacher(cfg, student, student_path, device)
    assert model is not None
    return InProcessTeacher(
        model, student.pad_token_id, cfg.rollout.generation_batch_size, cfg.packed
    )
