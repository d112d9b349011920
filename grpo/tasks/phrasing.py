"""How a question is put to the model: the task's answer instruction and the system prompt,
varied during training (`data.instructions`) and, in evaluation, replaced by phrasings that
training never used (`eval.prompt_variants`), so that a run shows whether what it learned
holds under other words or only under the one prompt it was trained with.

A task declares its answer instruction (`Task.instruction`, e.g. GSM8K's `Give the final answer
on its own line as "#### <number>".`); a phrasing's instruction replaces that text in the
question's message. A task that declares none takes system-prompt variants only.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from grpo.config.data import Phrasing

from .base import Row, Task


def unseen(variants: Sequence[Phrasing], instructions: Sequence[str], system_prompt: str) -> None:
    """ValueError naming a variant that is one of training's own phrasings: its instruction
    among `instructions` (the task's, and data.instructions), or its system prompt training's,
    with nothing else changed. Such a variant would measure the training prompt again."""
    for v in variants:
        same_instruction = v.instruction is None or v.instruction.strip() in {
            s.strip() for s in instructions
        }
        same_system = v.system_prompt is None or v.system_prompt.strip() == system_prompt.strip()
        if same_instruction and same_system:
            raise ValueError(
                f"variant {v.name!r} is a phrasing training uses: give it another "
                "instruction or system prompt"
            )


def _replaced(messages: list[dict[str, str]], old: str, new: str) -> list[dict[str, str]]:
    """The messages with the last user message's `old` (the task's instruction) made `new`."""
    for k in range(len(messages) - 1, -1, -1):
        if messages[k]["role"] == "user" and old in messages[k]["content"]:
            content = messages[k]["content"].replace(old, new)
            return [*messages[:k], {**messages[k], "content": content}, *messages[k + 1 :]]
    raise ValueError(f"the task's instruction {old!r:.60} is not in its question's message")


def rephrased(task: Task, phrasing: Phrasing) -> Task:
    """`task` asking its questions as `phrasing` says (the run's system prompt, given to
    build_messages, is replaced when the phrasing has one)."""
    if phrasing.instruction is not None and not task.instruction:
        raise ValueError(
            f"task {task.name!r} declares no answer instruction to vary: variant "
            f"{phrasing.name!r} may set a system_prompt only"
        )

    def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
        system = system_prompt if phrasing.system_prompt is None else phrasing.system_prompt
        messages = task.build_messages(row, system)
        if phrasing.instruction is None:
            return messages
        return _replaced(messages, task.instruction, phrasing.instruction)

    return dataclasses.replace(task, build_messages=build_messages)


def varied(task: Task, instructions: Sequence[str]) -> Task:
    """`task` asking each question with one of `instructions` (data.instructions: the task's
    own among them only if listed), the same one for the same question every time it is drawn
    (picked by a checksum of its message, so a resumed run asks it alike); the task itself for
    none."""
    if not instructions:
        return task
    if not task.instruction:
        raise ValueError(f"task {task.name!r} declares no answer instruction to vary")
    choices = tuple(instructions)

    def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
        messages = task.build_messages(row, system_prompt)
        pick = zlib.crc32(messages[-1]["content"].encode()) % len(choices)
        return _replaced(messages, task.instruction, choices[pick])

    return dataclasses.replace(task, build_messages=build_messages)
