"""What the reward service scores with: a sequence-classification reward model or a generative
judge, looked up by name (`reward_server.backend`), or your own as 'package.module:name' (a
function `build(cfg) -> RewardBackend`); and, with teacher.where: service, the on-policy
distillation teacher (`ServedTeacher`).

Both put the question and the answer through the model's chat template (user, assistant), so a
reward model trained on chat data sees the layout it was trained on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from grpo.config import Config
from grpo.config.sampling import judge_template_problem
from grpo.core.registry import Registry
from grpo.models.loading import load_causal_lm, load_tokenizer, resolve_model_path, torch_dtype
from grpo.reward_service.protocol import Item

log = logging.getLogger("grpo.reward")

Scored = tuple[float, dict[str, Any]]

DEFAULT_TEMPLATE = (
    "Grade the answer to this question.\n\n"
    "Question: {prompt}\n\n"
    "Reference answer: {reference}\n\n"
    "Answer to grade: {answer}\n\n"
    "Is the answer correct and does it reach the reference answer? End your reply with "
    "'Score: N', N an integer from 0 (wrong) to 10 (fully correct)."
)


class RewardBackend(Protocol):
    name: str

    def score(self, items: Sequence[Item]) -> list[Scored]:
        """One (reward, info) per item, in order; info holds JSON scalars only."""
        ...


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _chat(tokenizer, user: str, assistant: str | None = None) -> str:
    """The conversation as the model's chat template writes it (plain text if it has none):
    with `assistant`, the full exchange; without, the prompt for the model's reply."""
    messages = [{"role": "user", "content": user}]
    if assistant is not None:
        messages.append({"role": "assistant", "content": assistant})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=assistant is None
        )
    return user + ("\n\n" + assistant if assistant is not None else "\n\n")


class Classifier:
    """AutoModelForSequenceClassification: one logit is the reward (num_labels=1, as reward
    models are trained); with two labels, the probability of the second ('good')."""

    name = "classifier"

    def __init__(self, path: Path, dtype: str, batch_size: int, max_tokens: int):
        from transformers import AutoModelForSequenceClassification

        self.tokenizer = load_tokenizer(path)
        self.tokenizer.padding_side = "right"  # the score is read at the last real token
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch_dtype(dtype))
        model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = model.eval().to(_device())
        self.batch_size, self.max_tokens = batch_size, max_tokens

    @torch.no_grad()
    def score(self, items: Sequence[Item]) -> list[Scored]:
        texts = [_chat(self.tokenizer, it.prompt, it.answer) for it in items]
        out: list[Scored] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            ).to(self.model.device)
            logits = self.model(**enc).logits.float()
            values = logits[:, 0] if logits.shape[-1] == 1 else logits.softmax(-1)[:, -1]
            out += [(float(v), {"rm_score": float(v)}) for v in values]
        return out


_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
# A number ending the reply, read backwards from the end: the reply reversed, then a run of
# non-word characters (blanks and punctuation after the number) and the number reversed.
# Matched once at the start, not searched from every position: linear, where the forward
# pattern "(-?\d+(?:\.\d+)?)\s*\W*\s*$" split a run of blanks between its three
# quantifiers from every start, cubic (issue 29, finding 5).
_LAST_NUMBER_REVERSED = re.compile(r"\W*((?:\d+\.)?\d+-?)")


def score_in_reply(reply: str) -> float | None:
    """The judge's score: the last 'Score: N' in its reply, else a number ending the reply
    (blanks and punctuation may follow it); None if there is neither."""
    found = _SCORE.findall(reply)
    if found:
        return float(found[-1])
    end = _LAST_NUMBER_REVERSED.match(reply[::-1])
    return float(end.group(1)[::-1]) if end else None


def normalised(value: float, low: float, high: float) -> float:
    """`value` on the judge's scale [low, high] as a reward in [0, 1], clipped."""
    return min(max((value - low) / (high - low), 0.0), 1.0)


class Judge:
    """Any causal LM asked, through `template`, to grade the answer; its reply ends in a score
    on [low, high], read by score_in_reply and scaled to [0, 1]. A reply without one scores 0
    with a `judge_error`. Greedy, so a repeated answer gets the same score."""

    name = "judge"

    def __init__(
        self,
        path: Path,
        dtype: str,
        template: str,
        scale: tuple[float, float],
        max_new_tokens: int,
        batch_size: int,
        max_tokens: int = 2048,
    ):
        from grpo.rollout.base import Sampling
        from grpo.rollout.hf import HFRollout

        problem = judge_template_problem(template)
        if problem:
            raise ValueError(f"the judge's template: {problem}")
        self.tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype).eval().to(_device())
        self.engine = HFRollout(model, self.tokenizer)
        self.template, self.scale = template, scale
        # The prompt's limit: reward_server.max_tokens, and the model's context less the reply.
        context = getattr(model.config, "max_position_embeddings", None) or max_tokens
        self.max_prompt_tokens = max(1, min(max_tokens, context - max_new_tokens))
        # one greedy verdict per item
        self.sampling = Sampling(max_new_tokens=max_new_tokens, greedy=True, batch_size=batch_size)

    def prompt(self, fields: dict[str, str]) -> str:
        return _chat(self.tokenizer, self.template.format(**fields))

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, item: Item) -> list[int]:
        """The prompt's tokens, within max_prompt_tokens: while over, the longest of the
        question, answer and reference is cut in its middle (its start and its end, where the
        final answer is, kept). ValueError if the template alone is too long."""
        fields = {"prompt": item.prompt, "answer": item.answer,
                  "reference": item.reference or "(none given)"}  # fmt: skip
        for _ in range(2 * len(fields)):
            ids = self._ids(self.prompt(fields))
            over = len(ids) - self.max_prompt_tokens
            if over <= 0:
                return ids
            longest = max(fields, key=lambda k: len(fields[k]))
            fields[longest] = self._cut(fields[longest], over)
        raise ValueError(
            f"the judge's prompt is {len(ids)} tokens with the question and answer cut, over "
            f"its limit of {self.max_prompt_tokens} (reward_server.max_tokens, the model's "
            "context less max_new_tokens): shorten reward_server.template"
        )

    def _cut(self, text: str, over: int) -> str:
        """`text` with `over` tokens (and a few more: re-tokenizing may differ) cut from its
        middle, marked '[...]'."""
        ids = self._ids(text)
        keep = max(0, len(ids) - over - 8)
        head, tail = ids[: (keep + 1) // 2], ids[len(ids) - keep // 2 :] if keep > 1 else []
        return self.tokenizer.decode(head) + " [...] " + self.tokenizer.decode(tail)

    def score(self, items: Sequence[Item]) -> list[Scored]:
        out: list[Scored | None] = [None] * len(items)
        prompts, where = [], []
        for i, item in enumerate(items):
            try:
                prompts.append(np.asarray(self.prompt_ids(item), dtype=np.int64))
                where.append(i)
            except ValueError as e:  # this item's failure alone
                out[i] = (0.0, {"reward_error": f"reward service: {e}"})
        gens = self.engine.generate(prompts, self.sampling) if prompts else []
        replies = self.tokenizer.batch_decode(
            [g.completion_ids for g in gens], skip_special_tokens=True
        )
        for i, reply in zip(where, replies, strict=True):
            value = score_in_reply(reply)
            info: dict[str, Any] = {"judge_reply": reply[-200:]}
            if value is None:
                out[i] = (0.0, info | {"judge_error": "no score in the reply"})
            else:
                out[i] = (normalised(value, *self.scale), info | {"judge_score": value})
        return out  # type: ignore[return-value]  # every item set


def _classifier(cfg: Config) -> RewardBackend:
    s = cfg.reward_server
    path = resolve_model_path(s.model, "reward_server.model")
    return Classifier(path, s.dtype, s.batch_size, s.max_tokens)


def _judge(cfg: Config) -> RewardBackend:
    s = cfg.reward_server
    low, high = s.score_range
    path = resolve_model_path(s.model, "reward_server.model")
    return Judge(
        path,
        s.dtype,
        s.template or DEFAULT_TEMPLATE,
        (low, high),
        s.max_new_tokens,
        s.batch_size,
        s.max_tokens,
    )


BACKENDS: Registry[Callable[[Config], RewardBackend]] = Registry(
    "reward backend", callable, "a factory"
)
BACKENDS.add("classifier", _classifier)
BACKENDS.add("judge", _judge)


def build_backend(cfg: Config) -> RewardBackend:
    """The backend reward_server.backend names: a registered one or 'package.module:name'."""
    return BACKENDS.get(cfg.reward_server.backend)(cfg)


class ServedTeacher:
    """teacher.where: service: the teacher of teacher.path on this node's device, scoring the
    samplers' answers token by token with grpo.scoring's kernels (InProcessTeacher), within
    its vocabulary (the embedding's rows) and teacher.max_tokens, for samplers whose tokenizer
    has its fingerprint."""

    def __init__(
        self,
        path: Path,
        dtype: str,
        batch_size: int,
        max_tokens: int,
        packed: bool,
        attn_implementation: str = "sdpa",
    ):
        from grpo.models.loading import load_reference
        from grpo.scoring.teacher import InProcessTeacher, tokenizer_fingerprint

        self.path, self.max_tokens = str(path), max_tokens
        tokenizer = load_tokenizer(path)
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        model = load_reference(path, dtype, attn_implementation).to(_device())
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.scorer = InProcessTeacher(model, pad_id, batch_size, packed)

    @classmethod
    def load(cls, cfg: Config) -> ServedTeacher:
        path = resolve_model_path(cfg.teacher.path, "teacher.path")
        return cls(
            path,
            cfg.teacher.dtype,
            cfg.reward_server.batch_size,
            cfg.teacher.max_tokens,
            cfg.packed,
            cfg.model.attn_implementation,
        )

    def tokenizer_difference(self, sampler: Any) -> str | None:
        from grpo.scoring.teacher import fingerprint_difference

        return fingerprint_difference(sampler, self.fingerprint)

    def logprobs(self, prompts, completions, temperature: float) -> list[np.ndarray]:
        return self.scorer.logprobs(prompts, completions, temperature)
