"""The ``prompts`` task: rows whose ``prompt`` column is the question, as verl's and TRL's
datasets have them: a list of chat messages (verl's parquet schema, TRL's conversational
format) or a string (TRL's standard format).

The chat is the row's messages as they are, after ``data.system_prompt`` when the row brings
no system message of its own. The reward is ``data.reward`` (a verl ``compute_score``, a TRL
reward function or grpo's own: grpo.tasks.conventions); without one, verl rows of a data source
that grpo checks itself (GSM8K, MATH) are scored by that task's reward against
``reward_model.ground_truth``, as verl's default reward does.
"""

from __future__ import annotations

from . import gsm8k, math500
from .base import RewardFn, Row, Task, load_rows_with, register_task

# verl's data_source names (verl.utils.reward_score.default_compute_score) and grpo's checkers.
CHECKERS: dict[str, RewardFn] = {
    "openai/gsm8k": gsm8k.reward,
    "lighteval/MATH": math500.reward,
    "DigitalLearningGmbH/MATH-lighteval": math500.reward,
    "HuggingFaceH4/MATH-500": math500.reward,
}


def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
    prompt = row["prompt"]
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def reward(completion: str, row: Row) -> float | tuple[float, dict]:
    """The checker of the row's ``data_source`` against ``reward_model.ground_truth``."""
    source = row.get("data_source")
    checker = CHECKERS.get(str(source))
    if checker is None:
        raise ValueError(
            f"no built-in reward for data_source {source!r} (grpo checks "
            f"{', '.join(sorted(CHECKERS))}): set data.reward to your compute_score"
        )
    return checker(completion, {"answer": row["reward_model"]["ground_truth"]})


def load(source: str) -> list[Row]:
    """Rows with a ``prompt`` (a string or a list of ``{role, content}`` messages)."""
    rows = load_rows_with(source, ("prompt",))
    for i, row in enumerate(rows):
        prompt = row["prompt"]
        # An empty prompt (or chat) would have the model answer nothing but the template
        ok = (isinstance(prompt, str) and prompt.strip() != "") or (
            isinstance(prompt, list)
            and any(isinstance(m, dict) and m.get("role") == "user" for m in prompt)
            and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in prompt)
        )
        if not ok:
            raise ValueError(
                f"{source}: row {i}: 'prompt' must be a non-empty string or a list of "
                f"{{role, content}} messages with a user message, got {prompt!r:.120}"
            )
    return rows


TASK = register_task(
    Task(
        name="prompts",
        load=load,
        build_messages=build_messages,
        reward=reward,
        default_train="",
        default_test="",
    )
)
