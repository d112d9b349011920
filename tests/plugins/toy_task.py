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
    correct = row["answer"] in completion
    return float(correct), {"correct": correct, "formatted": any(c.isdigit() for c in completion)}


TASK = Task("toy_repeat", load, build_messages, reward, default_train="train", default_test="test")
