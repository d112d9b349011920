"""On-policy distillation's teacher in the sampler process (teacher.where: sampler): loaded
once, refused when its tokenizer is not the student's, and run over the student's answers like
the reference model (grpo.scoring.score)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from grpo.config import Config
from grpo.models.embedded import ModelError
from grpo.models.loading import load_reference, load_tokenizer, resolve_model_path


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
    try:
        path = resolve_model_path(cfg.teacher.path)
    except ModelError as e:  # its message names the key it checks for the policy
        raise ModelError(str(e).replace("model.path", "teacher.path", 1)) from None
    check_same_tokenizer(student, load_tokenizer(path), student_path, path)
    model = load_reference(path, cfg.teacher.dtype, cfg.model.attn_implementation)
    return model.to(device)
