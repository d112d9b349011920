"""Word problems generated from a seed: graded tasks easier than GSM8K, whose multi-step
problems stay out of a 135M model's reach on two CPU cores (docs/benchmarks.md, "A recipe whose
accuracy rises").

- `arithmetic`: two steps, adding and taking away numbers up to 60 in a short story ("Ann has
  23 apples. She buys 58 more and gives away 17. How many apples does Ann have now?"). The
  embedded SmolLM2-135M answers 1-3 % of them (greedy), too few for a group of answers to
  disagree: GRPO has almost nothing to learn from.
- `addition`: one step, a number up to 20 and one up to 9 ("Ann has 12 apples. She buys 7
  more. ..."), configs/cpu_arithmetic.yaml's task: 40 % of the embedded model's groups of 8
  sampled answers hold both right and wrong ones.

Each answer field is GSM8K's (`#### 64`), so the GSM8K reward scores it, worked-answer rules and
all. The rows are made, not read: `data.train` / `data.test` name a split, `train` or `test`
(or `split:count`), each drawn from its own seed, and no test question is among the train ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from . import gsm8k
from .base import Row, Task, register_task

SEEDS = {"train": 0, "test": 1}
SIZES = {"train": 20_000, "test": 1_000}
# addition has 6 stories x 19 x 8 questions (912): 300 held out, the other 612 to train on
SUM_SIZES = {"train": 612, "test": 300}

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
    """One two-step problem: `question`, and `answer` in GSM8K's form (working, `#### N`)."""
    who, pronoun, asked, thing, gain, loss = rng.choice(_STORIES)
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    c = rng.randint(1, a + b - 1)
    text = (
        f"{who} has {a} {thing}. {pronoun} {gain} {b} more and {loss} {c}. "
        f"How many {thing} does {asked} have now?"
    )
    total = a + b - c
    return {
        "question": text,
        "answer": f"{a} + {b} = {a + b}, {a + b} - {c} = {total}\n#### {total}",
    }


def sum_question(rng: random.Random) -> Row:
    """One one-step sum of a number up to 20 and one up to 9, in GSM8K's form."""
    who, pronoun, asked, thing, gain, _ = rng.choice(_STORIES)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    text = (
        f"{who} has {a} {thing}. {pronoun} {gain} {b} more. How many {thing} does {asked} have now?"
    )
    working = f"{who} has {a} + {b} = {a + b} {thing} now."  # worked, as GSM8K's reward wants
    return {"question": text, "answer": f"{working}\n#### {a + b}"}


Generator = Callable[[random.Random], Row]


def generated(
    split: str, count: int, make: Generator = question, sizes: dict[str, int] = SIZES
) -> list[Row]:
    """`count` problems of `split` (`train` or `test`) made by `make`, the same on every call;
    train leaves out every test question (the `sizes["test"]` first of test)."""
    rng = random.Random(SEEDS[split])
    held_out = set()
    if split == "train":
        held_out = {r["question"] for r in generated("test", sizes["test"], make, sizes)}
    rows: list[Row] = []
    seen: set[str] = set()
    while len(rows) < count:
        row = make(rng)
        if row["question"] not in seen and row["question"] not in held_out:
            seen.add(row["question"])
            rows.append(row)
    return rows


def loader(name: str, make: Generator, sizes: dict[str, int]) -> Callable[[str], list[Row]]:
    """The `load` of task `name`: `train`, `test`, or `split:count` (at most the split's size)."""

    def load(source: str) -> list[Row]:
        split, _, count = source.partition(":")
        if split not in SEEDS:
            raise ValueError(
                f"{name} rows are generated: name a split, train or test (or "
                f"split:count), not {source!r}"
            )
        n = sizes[split] if not count else int(count) if count.isdigit() else -1
        if not 0 < n <= sizes[split]:
            raise ValueError(f"{name} {split}: count must be 1 to {sizes[split]}, got {count!r}")
        return generated(split, n, make, sizes)

    return load


def _task(name: str, make: Generator, sizes: dict[str, int]) -> Task:
    return register_task(
        Task(
            name=name,
            load=loader(name, make, sizes),
            build_messages=gsm8k.build_messages,
            reward=gsm8k.reward,
            instruction=gsm8k.ANSWER_INSTRUCTION,
            count_markers=gsm8k.count_markers,
            default_train="train",
            default_test="test",
        )
    )


TASK = _task("arithmetic", question, SIZES)
ADDITION = _task("addition", sum_question, SUM_SIZES)
