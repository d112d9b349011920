"""On-policy distillation's teacher: what scores the student's answers (a TeacherScorer), in
the sampler process (teacher.where: sampler: InProcessTeacher, loaded once, refused when its
tokenizer is not the student's, run over the answers like the reference model) or in the reward
service (where: service: grpo.reward_service.client.RemoteTeacher, the same interface, which
sends the tokenizer's fingerprint with each request for the service to compare)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from grpo.config import Config
from grpo.models.embedded import ModelError
from grpo.models.loading import load_reference, load_tokenizer, resolve_model_path
from grpo.scoring.score import score_pairs


class TeacherScorer(Protocol):
    def logprobs(
        self, prompts: Sequence[np.ndarray], completions: Sequence[np.ndarray], temperature: float
    ) -> list[np.ndarray]:
        """The teacher's log-prob of each completion token (float32, one array per answer) at
        `temperature`, in order."""
        ...


class InProcessTeacher:
    """A teacher model in this process, scored with grpo.scoring.score.score_pairs."""

    def __init__(self, model: torch.nn.Module, pad_id: int, batch_size: int, packed: bool):
        self.model, self.pad_id, self.batch_size, self.packed = model, pad_id, batch_size, packed

    def logprobs(
        self, prompts: Sequence[np.ndarray], completions: Sequence[np.ndarray], temperature: float
    ) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [np.zeros(0, np.float32)] * len(completions)
        # An empty completion has nothing to score (and a forward needs a token to predict).
        run = [i for i, c in enumerate(completions) if len(c)]
        if run:
            logps, _ = score_pairs(
                self.model,
                [prompts[i] for i in run],
                [completions[i] for i in run],
                pad_id=self.pad_id,
                temperature=temperature,
                batch_size=self.batch_size,
                packed=self.packed,
            )
            for i, logp in zip(run, logps, strict=True):
                out[i] = logp
        return out  # type: ignore[return-value]  # every one set


def tokenizer_fingerprint(tok: PreTrainedTokenizerBase) -> dict[str, Any]:
    """What tokenizer_difference compares, small enough to send with every request: the
    vocabulary's size and digest, and the special tokens with their ids."""
    vocab = json.dumps(sorted(tok.get_vocab().items()), ensure_ascii=False)
    special = _special(tok)
    return {
        "vocab_size": len(tok.get_vocab()),
        "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
        "special": {k: [v[0], v[1]] for k, v in special.items() if k != "all"},
        "all_special": [[t, i] for t, i in special["all"]],
    }


def fingerprint_difference(student: Any, teacher: dict[str, Any]) -> str | None:
    """What differs between a sampler's tokenizer fingerprint (as received: any value) and the
    teacher's, in tokenizer_difference's words; None when they are the same."""
    if not isinstance(student, dict) or set(student) != set(teacher):
        return "the sampler sent no tokenizer fingerprint this service can read"
    if student["vocab_sha256"] != teacher["vocab_sha256"]:
        return (
            f"vocabularies differ ({student['vocab_size']!r:.20} vs {teacher['vocab_size']} tokens)"
        )
    s_special, t_special = student["special"], teacher["special"]
    if s_special != t_special and isinstance(s_special, dict):
        keys = sorted(set(map(str, s_special)) | set(t_special))
        key = next((k for k in keys if s_special.get(k) != t_special.get(k)), "?")
        s_value = s_special.get(key, [None])[0] if isinstance(s_special.get(key), list) else None
        t_value = t_special.get(key, [None])[0]
        return f"special token {key} is {s_value!r:.60} vs {t_value!r:.60}"
    if student != teacher:
        return "their special tokens differ"
    return None


def tokenizer_difference(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase
) -> str | None:
    """What differs between two tokenizers (their vocabularies, then their special tokens), or
    None. The teacher scores the student's token ids: a different vocabulary would make its
    log-probs those of other tokens, silently."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        only = sorted(set(s_vocab.items()) ^ set(t_vocab.items()))
        return f"vocabularies differ ({len(s_vocab)} vs {len(t_vocab)} tokens; e.g. {only[0]!r})"
    s_special, t_special = _special(student), _special(teacher)
    if s_special != t_special:
        key = next(k for k in sorted(s_special | t_special) if s_special.get(k) != t_special.get(k))
        return f"special token {key} is {s_special.get(key)!r} vs {t_special.get(key)!r}"
    return None


def _special(tok: PreTrainedTokenizerBase) -> dict[str, object]:
    """The named special tokens (bos, eos, pad...) with their ids, and all of them."""
    named = {
        name: (value, tok.convert_tokens_to_ids(value))
        for name, value in tok.special_tokens_map.items()
        if isinstance(value, str)
    }
    every = zip(tok.all_special_tokens, tok.all_special_ids, strict=True)
    return named | {"all": tuple(sorted(every))}


def check_same_tokenizer(
    student: PreTrainedTokenizerBase,
    teacher: PreTrainedTokenizerBase,
    student_path: Path | str,
    teacher_path: Path | str,
) -> None:
    """ModelError, one line naming both models, when the teacher's tokenizer differs."""
    difference = tokenizer_difference(student, teacher)
    if difference is not None:
        raise ModelError(
            f"teacher.path {str(teacher_path)!r} has another tokenizer than the student "
            f"{str(student_path)!r}: {difference}; on-policy distillation needs the same one"
        )


def load_teacher(
    cfg: Config, student: PreTrainedTokenizerBase, student_path: Path, device: torch.device
) -> torch.nn.Module | None:
    """The frozen teacher of teacher.path on `device`, after its tokenizer is checked; None
    when the run has no teacher."""
    if not cfg.teacher.path:
        return None
    path = resolve_model_path(cfg.teacher.path, "teacher.path")
    check_same_tokenizer(student, load_tokenizer(path), student_path, path)
    model = load_reference(path, cfg.teacher.dtype, cfg.model.attn_implementation)
    return model.to(device)
