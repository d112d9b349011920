"""HF `generate` rollout: G answers per prompt, ending at EOS, a stop string or the cap."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from grpo.core.batching import pad_pairs
from grpo.rollout.base import Generation, Sampling
from grpo.runtime.progress import ACTIVITY
from grpo.weights.version import Version


class _StopWhenSet(StoppingCriteria):
    """Ends generate() early when the sampler is told to stop (trainer gone, Ctrl-C); called
    once per token step, it also counts the steps as progress."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        ACTIVITY.tick()  # a token step: progress for the stall check (grpo.runtime.progress)
        # On the ids' device: generate() combines it with its own flags there (a CPU tensor
        # here stopped the first GPU run).
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _split_completion(row: torch.Tensor, eos: set[int], max_new: int) -> tuple[np.ndarray, str]:
    tokens = row.tolist()
    for j, tok in enumerate(tokens):
        if tok in eos:
            return np.asarray(tokens[: j + 1], dtype=np.int32), "stop"
    return np.asarray(tokens[:max_new], dtype=np.int32), "length"


def _cut_at_stop(
    tokens: np.ndarray, reason: str, tokenizer, stop: Sequence[str]
) -> tuple[np.ndarray, str]:
    """The shortest prefix whose text contains a stop string (where vLLM ends an answer), or
    the answer as it was.

    generate() pads a row that hit a stop string with pad tokens (EOS for many models), which
    must not count as sampled. Containment only grows with the prefix: binary search."""

    def has_stop(k: int) -> bool:
        text = tokenizer.decode(tokens[:k].tolist(), skip_special_tokens=False)
        return any(s in text for s in stop)

    if not has_stop(len(tokens)):
        return tokens, reason
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if has_stop(mid) else (mid + 1, hi)
    return tokens[:lo], "stop"


class HFRollout:
    """Samples with `model.generate`; groups are contiguous (n copies of each prompt in a row).
    Reports no engine log-probs (generate's scores would cost a full vocabulary per token).

    `synced`: the model's parameters are ZeRO-3 partitions, gathered by every forward pass, so
    the ranks calling generate together go on stepping until the last of them has finished
    (generate's synced_gpus); they must make the same calls with the same number of rows."""

    def __init__(
        self,
        model,
        tokenizer,
        stop_event: threading.Event | None = None,
        cache: str = "dynamic",
        synced: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.cache = cache  # rollout.hf_cache
        self.synced = synced
        self.stop_event = stop_event or threading.Event()
        self.eos = eos_ids(model, tokenizer)
        # generate() fills every option we leave unset from the model's generation_config;
        # a shipped repetition_penalty or min_p would warp the sampling distribution away from
        # the one the log-probs describe. Keep only the special tokens.
        model.generation_config = GenerationConfig(
            bos_token_id=model.generation_config.bos_token_id,
            eos_token_id=self.eos,
            pad_token_id=tokenizer.pad_token_id,
        )

    @torch.no_grad()
    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        greedy, stop, max_new_tokens = sampling.greedy, sampling.stop, sampling.max_new_tokens
        gen_cfg = GenerationConfig(
            do_sample=not greedy,
            temperature=sampling.temperature if not greedy else None,
            top_p=sampling.top_p if not greedy else None,
            top_k=sampling.top_k if not greedy else None,
            stop_strings=list(stop) or None,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if sampling.ignore_eos else None,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.eos,
            cache_implementation=None if self.cache == "dynamic" else self.cache,
        )
        torch.manual_seed(sampling.seed)
        rows = [p for p in prompts for _ in range(sampling.n)]
        out: list[Generation] = []
        for start in range(0, len(rows), sampling.batch_size):
            chunk = rows[start : start + sampling.batch_size]
            padded = pad_pairs(
                chunk, [np.zeros(0, np.int32)] * len(chunk), self.tokenizer.pad_token_id
            )
            P = padded.prompt_len
            ids, attn = padded.input_ids[:, :P], padded.attention_mask[:, :P]
            seqs = self.model.generate(
                input_ids=ids.to(self.model.device),
                attention_mask=attn.to(self.model.device),
                generation_config=gen_cfg,
                stopping_criteria=StoppingCriteriaList([_StopWhenSet(self.stop_event)]),
                tokenizer=self.tokenizer if stop else None,  # stop strings are matched on text
                synced_gpus=self.synced,
            )
            for prompt, row in zip(chunk, seqs[:, P:].cpu(), strict=True):
                completion, reason = _split_completion(row, set(self.eos), max_new_tokens)
                if stop:  # before any EOS: generate() pads a row that hit a stop string
                    completion, reason = _cut_at_stop(completion, reason, self.tokenizer, stop)
                out.append(Generation(np.asarray(prompt, np.int32), completion, reason))
            if self.stop_event.is_set():
                break
        return out

    def load(self, version: Version) -> None:
        """Nothing to do: the model is the sampler's policy, which the sampler reloads."""

    def close(self) -> None:
        """Nothing held beyond the sampler's own model."""
