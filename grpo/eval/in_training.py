"""Evaluation between steps: every `eval.interval`-th version (and the first and the last).

eval.engine: trainer: on the trainer's ranks, on the weights being trained (the version just
published), whichever versions the samplers load, and no sampler waits for it. Each rank
answers every world-th question; rank 0 gathers the results and writes the row of eval.jsonl.
eval.engine: sampler: the sampler's engine answers (grpo.eval.from_sampler), rank 0 scores the
answers (`row_from_sampler`) with the same reward and writes the same row.

Under ZeRO-3 every generated token's forward pass gathers the parameters from all ranks, so the
ranks must generate in lockstep: each answers as many questions as the rank with the most (a
rank with fewer repeats one and drops its result) and generate() keeps every rank stepping
until the last has finished (HFRollout's `synced`). That is slow (one all-gather of the model
per token); `python -m grpo eval` on the published versions is the alternative."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.eval.from_sampler import answers_from_wire
from grpo.eval.questions import (
    EvalSpec,
    evaluation_sets,
    question_results,
    score_answers,
    summarise,
    variant_row,
)
from grpo.models.loading import params_partitioned
from grpo.observe.samples import ANSWERS_KEY, SAMPLES_KEY, eval_rows
from grpo.rollout.hf import HFRollout
from grpo.rollout.multi_turn import with_tools
from grpo.tasks import RewardRunner, run_reward, task_for

log = logging.getLogger("grpo.trainer")


class VersionEvaluator:
    def __init__(self, cfg: Config, tokenizer, rank: int, world: int):
        self.cfg, self.tokenizer, self.rank, self.world = cfg, tokenizer, rank, world
        self.spec = EvalSpec.from_config(cfg)
        # The run's questions (''), then each of eval.prompt_variants', by name
        self.sets: dict[str, list] = {"": []}
        self.reward_fn: Callable | None = None
        self.count_markers = None
        if cfg.eval.interval and cfg.eval.num_questions:
            task = task_for(cfg)
            self.reward_fn = run_reward(task, cfg.data.reward)
            self.count_markers = task.count_markers
            self.sets = evaluation_sets(cfg, task, tokenizer)
        self.prompts = self.sets[""]

    def due(self, version: int, last: bool) -> bool:
        interval = self.cfg.eval.interval
        return bool(self.prompts) and (version % interval == 0 or last)

    def evaluate(self, model: torch.nn.Module, version: int) -> dict | None:
        """Every rank: evaluate `model` (version `version`) under the run's prompt and each
        prompt variant; rank 0 returns the row."""
        t0 = time.monotonic()
        kept_config, was_training = model.generation_config, model.training
        model.eval()
        try:  # HFRollout strips the generation config, which versions save: put it back after
            # All sets in one pass: one engine, one reward runner, one gather across the ranks
            # (on this CPU no faster than a pass per set: 130 s either way for 96 answers).
            answered = self._answered(model, self.all_prompts(), version)
        finally:
            model.generation_config = kept_config
            model.train(was_training)
        if self.rank != 0:
            return None
        return self._row(answered, version, time.monotonic() - t0)

    def row_from_sampler(self, data: Any, version: int, seconds: float, vocab_size: int) -> dict:
        """Rank 0, eval.engine: sampler: the row of the answers the sampler sent for `version`
        (grpo.eval.from_sampler), scored here. ValueError when they are not answers to this
        evaluation's questions."""
        prompts = self.all_prompts()
        answered = answers_from_wire(data, prompts, self.spec, vocab_size)
        r, indices = self.cfg.reward, range(len(prompts))
        with RewardRunner(self.reward_fn, r.workers, r.timeout_s) as rewards:
            results = score_answers(answered, prompts, indices, self.tokenizer, rewards, self.spec)
        return self._row(results, version, seconds)

    def all_prompts(self) -> list:
        """The run's questions, then each prompt variant's: the one list the sets are answered
        in (by the trainer's ranks, or by the sampler)."""
        return [p for ps in self.sets.values() for p in ps]

    def _row(self, answered: list, version: int, seconds: float) -> dict:
        """The eval.jsonl row of `answered` (all sets' results, in all_prompts' order)."""
        by_set, start = {}, 0
        for name, prompts in self.sets.items():  # each set's results, indexed within it
            mine = answered[start : start + len(prompts)]
            by_set[name] = [replace(r, index=r.index - start) for r in mine]
            start += len(prompts)
        everyone = by_set.pop("")
        row = summarise(everyone, self.spec, version, seconds, self.count_markers)
        for name, results in by_set.items():
            shown = summarise(results, self.spec, version, seconds, self.count_markers)
            row.update(variant_row(shown, name))
        row["seconds"] = row.pop("seconds")  # after the variants' keys: the row's last, as before
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        shown = everyone[: self.cfg.logging.samples_per_step]
        row[SAMPLES_KEY] = eval_rows(shown, version, self.prompts, decode)  # RunLog takes them
        row[ANSWERS_KEY] = [r.answer for r in everyone]  # RunLog's Watch reads them
        log.info("eval v%d: %s (%.0f s)", version, said(row), row["seconds"])
        return row

    def _answered(self, model: torch.nn.Module, prompts: list, version: int) -> list:
        """Every rank: its share of `prompts` answered and scored; rank 0 returns all of them,
        in order, the others []."""
        mine = list(range(self.rank, len(prompts), self.world))
        own = len(mine)
        lockstep = params_partitioned(model)
        if lockstep:  # the same calls on every rank: pad with repeats, dropped below
            each = -(-len(prompts) // self.world)
            mine += [mine[0] if mine else 0] * (each - own)
        # with the run's tools, as the sampler answers (eval.max_new_tokens bounds it all)
        engine = with_tools(
            HFRollout(model, self.tokenizer, synced=lockstep), self.cfg.rollout, self.tokenizer
        )
        r = self.cfg.reward
        # Threads for this evaluation only: closing does not wait for a hung reward call.
        with RewardRunner(self.reward_fn, r.workers, r.timeout_s) as rewards:
            results = question_results(
                engine,
                prompts,
                mine,
                self.tokenizer,
                rewards,
                self.spec,
                version,
                progress=self.rank == 0,
            )
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, results[:own])
        if self.rank != 0:
            return []
        return sorted((r for part in gathered for r in part), key=lambda r: r.index)


def said(row: dict) -> str:
    """An eval row in one line: accuracy and format (as the reward reports them), pass@k, the
    degenerate share, and each prompt variant's format."""
    rates = [
        f"{name} {row[key]:.3f}"
        for name, key in (("accuracy", "accuracy"), ("format", "format_rate"))
        if key in row
    ]
    passes = [f"{k} {v:.3f}" for k, v in row.items() if k.startswith(("pass@", "accuracy/"))]
    out = ", ".join(rates) + f"{' on' if rates else 'on'} {row['n']} questions"
    if "degenerate_frac" in row:
        passes.append(f"degenerate {row['degenerate_frac']:.3f}")
    passes += [
        f"{k.replace('format_rate', 'format')} {v:.3f}"
        for k, v in row.items()
        if k.startswith("format_rate@")
    ]
    return out + (", " + ", ".join(passes) if passes else "")
