"""Two-step word problems generated from a seed: a graded task a 135M model can get better at
on two CPU cores within an hour (configs/cpu_arithmetic.yaml), where GSM8K's multi-step
problems stay out of its reach (docs/benchmarks.md, "A recipe whose accuracy rises").

Each question adds and takes away small numbers in a short story ("Ann has 23 apples. She buys
58 more and gives away 17. How many apples does she have now?"); its answer field is GSM8K's
(`#### 64`), so the GSM8K reward scores it, worked-answer rules and all. The rows are made, not
read: `data.train` / `data.test` name a split, `train` or `test` (or `split:count`), each drawn
from its own seed, and no test question is among the train ones.
"""

from __future__ import annotations

import random

from . import gsm8k
from .base import Row, Task, register_task

SEEDS = {"train": 0, "test": 1}
SIZES = {"train": 20_000, "test": 1_000}

# (who, pronoun, the who in a question, thing, verb of the gain, verb of the loss)
_STORIES = (
    ("Ann", "She", "Ann", "apples", "buys", "gives away"),
    ("Ben", "He", "Ben", "marbles", "wins", "loses"),
    ("A shop", "It", "the shop", "books", "gets", "sells"),
    ("Maya", "She", "Maya", "stickers", "is given", "uses"),
    ("A farm", "It", "the farm", "sheep", "buys", "sells"),
    ("Leo", "He", "Leo", "coins", "finds", "spends"),
)


def question(rng: random.Random) -> Row:
    """One generated problem: `question`, and `answer` in GSM8K's form (working, `#### N`)."""
    who, pronoun, asked, thing, gain, loss = rng.choice(_STORIES)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    c = rng.randint(1, a + b - 1)
    text = (f"{who} has {a} {thing}. {pronoun} {gain} {b} more and {loss} {c}. "
            f"How many {thing} does {asked} have now?")  # fmt: skip
    total = a + b - c
    return {
        "question": text,
        "answer": f"{a} + {b} = {a + b}, {a + b} - {c} = {total}\n#### {total}",
    }


def generated(split: str, count: int) -> list[Row]:
    """`count` problems of `split` (`train` or `test`), the same on every call; train leaves out
    every test question."""
    rng = random.Random(SEEDS[split])
    held_out = set()
    if split == "train":
        held_out = {r["question"] for r in generated("test", SIZES["test"])}
    rows: list[Row] = []
    seen: set[str] = set()
    while len(rows) < count:
        row = question(rng)
        if row["question"] not in seen and row["question"] not in held_out:
            seen.add(row["question"])
            rows.append(row)
    return rows


def load(source: str) -> list[Row]:
    """`train`, `test`, or `split:count` (at most the split's size)."""
    split, _, count = source.partition(":")
    if split not in SEEDS:
        raise ValueError(f"arithmetic rows are generated: name a split, train or test (or "
                         f"split:count), not {source!r}")  # fmt: skip
    n = SIZES[split] if not count else int(count) if count.isdigit() else -1
    if not 0 < n <= SIZES[split]:
        raise ValueError(f"arithmetic {split}: count must be 1 to {SIZES[split]}, got {count!r}")
    return generated(split, n)


TASK = register_task(
    Task(
        name="arithmetic",
        load=load,
        build_messages=gsm8k.build_messages,
        reward=gsm8k.reward,
        instruction=gsm8k.ANSWER_INSTRUCTION,
        count_markers=gsm8k.count_markers,
        default_train="train",
        default_test="test",
    )
)
