"""Evaluation: greedy pass@1 of a version on the first eval.num_questions test questions, one
row per version in eval.jsonl."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from grpo.config import Config
from grpo.metrics import EVAL_FILE, append_jsonl, info_rates
from grpo.rollout.base import RolloutEngine
from grpo.sampler.data import Prompt, encode_prompts
from grpo.sampler.episodes import raise_if_stopped
from grpo.tasks import Task, score

log = logging.getLogger("grpo.sampler")


class Evaluator:
    """Evaluates each version once, every eval.interval versions (none when it is 0)."""

    def __init__(self, cfg: Config, task: Task, tokenizer, reward_fn: Callable):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.prompts: list[Prompt] = []
        if cfg.eval.interval and cfg.eval.num_questions:
            test_rows = task.load(cfg.data.test or task.default_test)
            self.prompts = encode_prompts(
                task,
                test_rows[: cfg.eval.num_questions],
                tokenizer,
                cfg.data.system_prompt,
                cfg.data.max_prompt_tokens,
            )
        self.evaluated: set[int] = set()

    def due(self, version: int) -> bool:
        return bool(self.cfg.eval.interval) and version % self.cfg.eval.interval == 0

    def evaluate(self, engine: RolloutEngine, version: int) -> None:
        """One row in eval.jsonl for `version` (the weights `engine` serves), unless it has one."""
        if not self.prompts or version in self.evaluated:
            return
        t0 = time.monotonic()
        gens = engine.generate(
            [p.ids for p in self.prompts],
            n=1,
            greedy=True,
            max_new_tokens=self.cfg.eval.max_new_tokens,
            batch_size=self.cfg.rollout.generation_batch_size,
        )
        raise_if_stopped(engine)
        texts = self.tokenizer.batch_decode(
            [g.completion_ids for g in gens], skip_special_tokens=True
        )
        pairs = zip(texts, self.prompts, strict=True)
        infos = [score(self.reward_fn, t, p.row)[1] for t, p in pairs]
        row = {
            "version": version,
            **info_rates(infos),
            "n": len(infos),
            "seconds": round(time.monotonic() - t0, 2),
        }
        append_jsonl(self.cfg.run_dir / EVAL_FILE, row)
        self.evaluated.add(version)
        log.info(
            "eval v%d: accuracy %.3f, format %.3f on %d questions (%.0f s)",
            version,
            row["accuracy"],
            row["format_rate"],
            row["n"],
            row["seconds"],
        )
