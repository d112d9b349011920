"""Evaluation on the trainer's ranks, between steps: the weights being trained are the version
just published, so every `eval.interval`-th version (and the first and the last) is evaluated
whichever versions the samplers load, and no sampler waits for it. Each rank answers every
world-th question; rank 0 gathers the results and writes the row of eval.jsonl.

Under ZeRO-3 every generated token's forward pass gathers the parameters from all ranks, so the
ranks must generate in lockstep: each answers as many questions as the rank with the most (a
rank with fewer repeats one and drops its result) and generate() keeps every rank stepping
until the last has finished (HFRollout's `synced`). That is slow (one all-gather of the model
per token); `python -m grpo eval` on the published versions is the alternative."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.eval.questions import EvalSpec, eval_prompts, question_results, summarise
from grpo.models.loading import params_partitioned
from grpo.observe.samples import SAMPLES_KEY, eval_rows
from grpo.rollout.hf import HFRollout
from grpo.rollout.multi_turn import with_tools
from grpo.tasks import RewardRunner, run_reward, task_for

log = logging.getLogger("grpo.trainer")


class VersionEvaluator:
    def __init__(self, cfg: Config, tokenizer, rank: int, world: int):
        self.cfg, self.tokenizer, self.rank, self.world = cfg, tokenizer, rank, world
        self.spec = EvalSpec.from_config(cfg)
        self.prompts = []
        self.reward_fn: Callable | None = None
        if cfg.eval.interval and cfg.eval.num_questions:
            task = task_for(cfg)
            self.reward_fn = run_reward(task, cfg.data.reward)
            self.prompts = eval_prompts(cfg, task, tokenizer)

    def due(self, version: int, last: bool) -> bool:
        interval = self.cfg.eval.interval
        return bool(self.prompts) and (version % interval == 0 or last)

    def evaluate(self, model: torch.nn.Module, version: int) -> dict | None:
        """Every rank: evaluate `model` (version `version`); rank 0 returns the row."""
        t0 = time.monotonic()
        mine = list(range(self.rank, len(self.prompts), self.world))
        own = len(mine)
        lockstep = params_partitioned(model)
        if lockstep:  # the same calls on every rank: pad with repeats, dropped below
            each = -(-len(self.prompts) // self.world)
            mine += [mine[0] if mine else 0] * (each - own)
        kept_config, was_training = model.generation_config, model.training
        model.eval()
        r = self.cfg.reward
        try:  # HFRollout strips the generation config, which versions save: put it back after
            # with the run's tools, as the sampler answers (eval.max_new_tokens bounds it all)
            engine = with_tools(
                HFRollout(model, self.tokenizer, synced=lockstep), self.cfg.rollout, self.tokenizer
            )
            # Threads for this evaluation only: closing does not wait for a hung reward call.
            with RewardRunner(self.reward_fn, r.workers, r.timeout_s) as rewards:
                results = question_results(
                    engine, self.prompts, mine, self.tokenizer, rewards, self.spec, version,
                    progress=self.rank == 0,
                )  # fmt: skip
            results = results[:own]
        finally:
            model.generation_config = kept_config
            model.train(was_training)
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, results)
        if self.rank != 0:
            return None
        everyone = sorted((r for part in gathered for r in part), key=lambda r: r.index)
        row = summarise(everyone, self.spec, version, time.monotonic() - t0)
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        shown = everyone[: self.cfg.logging.samples_per_step]
        row[SAMPLES_KEY] = eval_rows(shown, version, self.prompts, decode)  # RunLog takes them
        passes = " ".join(
            f"{k} {v:.3f}"
            for k, v in row.items()
            if k.startswith("pass@") or k.startswith("accuracy/")  # with a mixture's entries'
        )
        said = (("accuracy", "accuracy"), ("format", "format_rate"))  # as the reward reports
        rates = ", ".join(f"{name} {row[key]:.3f}" for name, key in said if key in row)
        log.info(
            "eval v%d: %s %d questions%s (%.0f s)",
            version, f"{rates} on" if rates else "on", row["n"],
            f", {passes}" if passes else "", row["seconds"],
        )  # fmt: skip
        return row
