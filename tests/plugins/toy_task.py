"""A task written outside grpo/, as a user would: "repeat the number", with rows made in code.
Selected with `data.task=tests.plugins.toy_task:TASK`; nothing in grpo/ names it."""

from grpo.tasks import Row, Task


def load(source: str) -> list[Row]:
    """`source` is "train" or "test" (the defaults below); the rows are generated."""
    first = 0 if source == "train" else 1000
    return [{"question": f"Repeat the number {n}.", "answer": str(n)}
            for n in range(first, first + 64)]  # fmt: skip


def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": row["question"]}]


def reward(completion: str, row: Row) -> tuple[float, dict]:
    """1 for an answer that repeats the number; any other costs a thousandth per character
    (a repeat is short): a signal that even a random model's answers vary on, and below 0,
    where no built-in task's reward goes, so a run's rewards show that this one scored them."""
    correct = row["answer"] in completion
    score = 1.0 if correct else -min(len(completion), 1000) / 1000
    return score, {"correct": correct, "formatted": any(c.isdigit() for c in completion)}


TASK = Task("toy_repeat", load, build_messages, reward, default_train="train", default_test="test")
