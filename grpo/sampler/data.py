"""The questions: this sampler's shard of the train prompts, the seeded order it draws them in,
and how far into it the run is (recorded with every batch, read back on resume)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo.config import Config
from grpo.delivery.spool import Spool
from grpo.delivery.versions import require_same
from grpo.tasks import Row, Task

log = logging.getLogger("grpo.sampler")


@dataclass(frozen=True)
class Prompt:
    index: int  # row index in the dataset: the group id
    row: Row
    ids: np.ndarray  # int32 chat-templated prompt tokens


def encode_prompts(
    task: Task, rows: list[Row], tokenizer, system_prompt: str, max_tokens: int
) -> list[Prompt]:
    """Chat-template every row; rows whose prompt exceeds `max_tokens` are skipped (logged)."""
    prompts = []
    for i, row in enumerate(rows):
        text = tokenizer.apply_chat_template(
            task.build_messages(row, system_prompt), add_generation_prompt=True, tokenize=False
        )
        ids = np.asarray(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int32)
        if len(ids) <= max_tokens:
            prompts.append(Prompt(i, row, ids))
    if len(prompts) < len(rows):
        log.warning(
            "skipped %d prompts longer than %d tokens", len(rows) - len(prompts), max_tokens
        )
    if not prompts:
        raise ValueError(f"no prompt fits data.max_prompt_tokens={max_tokens}")
    return prompts


def question_stream(
    prompts: list[Prompt], n: int, seed: int, shuffle: bool, start: int = 0
) -> Iterator[list[Prompt]]:
    """Endless batches of `n` prompts; each epoch is a fresh seeded permutation. The first
    `start` prompts are skipped: a resumed sampler goes on where it stopped."""

    def order_of(epoch: int) -> np.ndarray:
        rng = np.random.default_rng(seed + epoch)
        return rng.permutation(len(prompts)) if shuffle else np.arange(len(prompts))

    epoch, pos = divmod(start, len(prompts))
    order = order_of(epoch)
    while True:
        batch = []
        while len(batch) < n:
            if pos == len(order):
                epoch, pos = epoch + 1, 0
                order = order_of(epoch)
            batch.append(prompts[order[pos]])
            pos += 1
        yield batch


class Shard:
    """This sampler's share of the train prompts, and `position`: how many it has drawn."""

    def __init__(self, cfg: Config, task: Task, tokenizer):
        self.cfg = cfg
        r = cfg.rollout
        prompts = encode_prompts(
            task,
            task.load(cfg.data.train or task.default_train),
            tokenizer,
            cfg.data.system_prompt,
            cfg.data.max_prompt_tokens,
        )
        # Disjoint shards by row index (rows i, i + n, ...), whatever prompts were skipped.
        self.prompts = [p for p in prompts if p.index % r.num_samplers == r.sampler_index]
        if not self.prompts:
            raise ValueError(f"sampler {r.sampler_index} of {r.num_samplers} has no train rows")
        self.position = 0
        self._stream: Iterator[list[Prompt]] | None = None

    def draw(self) -> list[Prompt]:
        """The next rollout.questions_per_step prompts, in the seeded order, from `position`."""
        if self._stream is None:
            r = self.cfg.rollout
            self._stream = question_stream(
                self.prompts, r.questions_per_step, r.seed, self.cfg.data.shuffle, self.position
            )
        prompts = next(self._stream)
        self.position += len(prompts)
        return prompts

    def fingerprint(self) -> dict[str, Any]:
        """What must not change for a dataset position to mean the same questions."""
        cfg = self.cfg
        return {
            "task": cfg.data.task,
            "train": cfg.data.train,
            "prompts": len(self.prompts),
            "first_row": self.prompts[0].index,
            "seed": cfg.rollout.seed,
            "shuffle": cfg.data.shuffle,
            "questions_per_step": cfg.rollout.questions_per_step,
            "num_samplers": cfg.rollout.num_samplers,
            "sampler_index": cfg.rollout.sampler_index,
        }

    def state(self, next_seq: int) -> dict[str, Any]:
        """The sampler state the spool records with a batch: where a resumed sampler goes on."""
        return {"next_seq": next_seq, "position": self.position, "fingerprint": self.fingerprint()}

    def resume(self, spool: Spool) -> int:
        """The next batch's seq, with `position` set to match: from the spool with train.resume,
        else zero (and the spool of an earlier run is emptied)."""
        where = spool.dir
        if self.cfg.train.resume == "never":
            spool.clear()
            return 0
        state = spool.read_state()
        if state is None:
            if self.cfg.train.resume == "always":
                raise ValueError(f"--resume: no sampler state in {where} (rollout.spool_dir)")
            return 0
        require_same(
            state["fingerprint"],
            self.fingerprint(),
            f"the sampler from {where}",
            "use the same data and rollout settings, or train.resume=never for a new run",
        )
        next_seq, position = state["next_seq"], state["position"]
        pending = spool.pending()
        if pending and pending[-1] >= next_seq:  # killed between spooling a batch and the state
            last = spool.batch(pending[-1])
            next_seq, position = last.seq + 1, int(last.stats["data_end"])
        log.info(
            "resuming at batch %d, question %d of the shard (%d batches spooled)",
            next_seq,
            position,
            len(pending),
        )
        self.position = position
        return next_seq
