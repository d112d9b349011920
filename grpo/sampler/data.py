"""The questions: this sampler's shard of the train prompts, the seeded order it draws them in,
and how far into it the run is (recorded with every batch, read back on resume)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from grpo.config import Config
from grpo.core.resume import require_same
from grpo.delivery.spool import Spool
from grpo.runtime.refusals import note
from grpo.tasks import Row, Task, mixture, phrasing
from grpo.tasks.encoding import Prompt, encode_prompt

log = logging.getLogger("grpo.sampler")


def question_order(count: int, seed: int, shuffle: bool, start: int = 0) -> Iterator[int]:
    """Endless indices into `count` items; each epoch is a fresh seeded permutation. The first
    `start` are skipped: a resumed sampler goes on where it stopped."""
    epoch, pos = divmod(start, count)
    while True:
        rng = np.random.default_rng(seed + epoch)
        order = rng.permutation(count) if shuffle else np.arange(count)
        for i in order[pos:]:
            yield int(i)
        epoch, pos = epoch + 1, 0


# A mixture picks each position's entry in blocks of this many, each block from its own seed:
# the pick at any position is found without drawing those before it, and a resumed sampler
# counts each entry's draws so far in a few vectorised blocks.
PICK_BLOCK = 4096
# Entry k of a mixture orders its rows with seed + k * ENTRY_SEED_STRIDE (entry 0: the seed).
ENTRY_SEED_STRIDE = 1_000_003


def entry_picks(weights: list[float], seed: int, block: int) -> np.ndarray:
    """The entries drawn at positions [block * PICK_BLOCK, (block + 1) * PICK_BLOCK)."""
    p = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng([seed, block, 0x6D6978])  # "mix": not the row orders' streams
    return rng.choice(len(p), size=PICK_BLOCK, p=p / p.sum())


def entry_counts(weights: list[float], seed: int, start: int) -> np.ndarray:
    """How many of the first `start` positions drew each entry."""
    counts = np.zeros(len(weights), dtype=np.int64)
    full, rest = divmod(start, PICK_BLOCK)
    for block in range(full):
        counts += np.bincount(entry_picks(weights, seed, block), minlength=len(weights))
    if rest:
        counts += np.bincount(entry_picks(weights, seed, full)[:rest], minlength=len(weights))
    return counts


def mixture_order(
    sizes: list[int], weights: list[float], seed: int, shuffle: bool, start: int = 0
) -> Iterator[tuple[int, int]]:
    """Endless (entry, row index) pairs: each position's entry picked by weight, each entry's
    rows in their own seeded order (question_order), all a pure function of the seed and the
    position; the first `start` are skipped, as a resumed sampler goes on."""
    done = entry_counts(weights, seed, start)
    orders = [
        question_order(n, seed + k * ENTRY_SEED_STRIDE, shuffle, int(done[k]))
        for k, n in enumerate(sizes)
    ]
    block, offset = divmod(start, PICK_BLOCK)
    while True:
        for k in entry_picks(weights, seed, block)[offset:]:
            yield int(k), next(orders[k])
        block, offset = block + 1, 0


@dataclass(frozen=True)
class Part:
    """One dataset's rows in this sampler's shard: (group id, row) pairs, and its weight."""

    name: str
    weight: float
    rows: list[tuple[int, Row]]


def shard_parts(cfg: Config, task: Task) -> list[Part]:
    """This sampler's rows of each dataset (one for a single dataset): rows i, i + n, ... of
    each. Group ids are row indices, a mixture's entry k's offset by the rows of the ones
    before it, so that no two questions of a run share one."""
    r = cfg.rollout
    if cfg.data.mixture:
        named = [(s.name, s.weight, mixture.train_rows(s)) for s in mixture.sources(cfg)]
    else:
        named = [(cfg.data.task, 1.0, task.load(cfg.data.train or task.default_train))]
    parts, offset = [], 0
    for name, weight, rows in named:
        mine = [
            (offset + i, row) for i, row in enumerate(rows) if i % r.num_samplers == r.sampler_index
        ]
        if not mine:
            raise ValueError(
                f"sampler {r.sampler_index} of {r.num_samplers} has no train rows"
                + (f" of {name!r}" if cfg.data.mixture else "")
            )
        parts.append(Part(name, weight, mine))
        offset += len(rows)
    return parts


class Shard:
    """This sampler's share of the train rows, and `position`: how many it has drawn.

    Rows are chat-templated and tokenized when drawn, not all up front: that took seconds at
    every start for GSM8K's 7,473 rows (minutes for a large dataset), most of them never drawn
    in a short run. A drawn row whose prompt is longer than data.max_prompt_tokens is skipped
    (it still counts in `position`, so a resumed run skips it too)."""

    def __init__(self, cfg: Config, task: Task, tokenizer):
        self.cfg = cfg
        self.parts = shard_parts(cfg, task)
        self.size = sum(len(p.rows) for p in self.parts)
        asked = phrasing.varied(task, cfg.data.instructions)  # one instruction per question
        self.encode = partial(
            encode_prompt, asked, tokenizer=tokenizer, system_prompt=cfg.data.system_prompt
        )
        self.position = 0
        self.skipped = 0  # drawn rows too long for data.max_prompt_tokens
        self._order: Iterator[int] | None = None

    def draw(self, count: int = 0) -> list[Prompt]:
        """The next `count` prompts that fit (0: rollout.questions_per_step), in the seeded
        order."""
        count = count or self.cfg.rollout.questions_per_step
        max_tokens = self.cfg.data.max_prompt_tokens
        if self._order is None:
            self._order = self.order(self.position)
        prompts: list[Prompt] = []
        skipped_in_a_row = 0
        while len(prompts) < count:
            part, i = next(self._order)
            index, row = self.parts[part].rows[i]
            self.position += 1
            ids = self.encode(row, max_tokens=max_tokens)
            if ids is not None:
                prompts.append(Prompt(index, row, ids, self.position - 1))
                skipped_in_a_row = 0
                continue
            self.skipped += 1
            note(
                log,
                self.skipped,
                "skipped train row %d: its prompt is longer than "
                "data.max_prompt_tokens=%d (%d rows skipped so far)",
                index,
                max_tokens,
                self.skipped,
            )
            skipped_in_a_row += 1
            if skipped_in_a_row >= self.size:
                raise ValueError(f"no train prompt fits data.max_prompt_tokens={max_tokens}")
        return prompts

    def prompt_at(self, position: int) -> Prompt:
        """The prompt drawn at `position` of the order (one that fit): a resumed continuous
        sampler finds the questions of its answers in flight by their positions."""
        part, i = next(self.order(position))
        index, row = self.parts[part].rows[i]
        ids = self.encode(row, max_tokens=self.cfg.data.max_prompt_tokens)
        if ids is None:
            raise ValueError(
                f"train row {index} at position {position} does not fit "
                "data.max_prompt_tokens: not the row this run drew there"
            )
        return Prompt(index, row, ids, position)

    def order(self, start: int) -> Iterator[tuple[int, int]]:
        """(part, row) pairs from position `start` on (mixture_order: with one dataset, its
        question_order, as before mixtures)."""
        seed, shuffle = self.cfg.rollout.seed, self.cfg.data.shuffle
        sizes, weights = [len(p.rows) for p in self.parts], [p.weight for p in self.parts]
        return mixture_order(sizes, weights, seed, shuffle, start)

    def fingerprint(self) -> dict[str, Any]:
        """What must not change for a dataset position to mean the same questions."""
        cfg = self.cfg
        mixed = (
            {"mixture": [[p.name, p.weight, len(p.rows)] for p in self.parts]}
            if cfg.data.mixture
            else {}
        )
        return {
            "task": cfg.data.task,
            "train": cfg.data.train,
            **mixed,
            "rows": self.size,
            "first_row": self.parts[0].rows[0][0],
            "max_prompt_tokens": cfg.data.max_prompt_tokens,
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
