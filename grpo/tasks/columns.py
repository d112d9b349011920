"""A column mapping (``rows.columns``): a dataset whose columns are not named as its task reads
them, used as it is. Each entry ``key=column`` gives every row the task's `key` with the value of
`column`, a dotted path into nested columns (``answer=reward_model.ground_truth``); the row's own
columns stay, for rewards that read them.

The mapping applies to the rows `grpo.tasks.load_rows` reads while the task loads
(`grpo.tasks.base.mapped` binds it to the task's `load`), before the task checks for its keys:
a task's loader needs no word of it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from grpo.config.data import Mapping

Row = dict[str, Any]

# The mapping of the load in progress (one task's, in this thread or task only).
_ACTIVE: ContextVar[Mapping] = ContextVar("grpo_column_mapping", default=())


def _lookup(row: Row, column: str) -> Any:
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def remap(rows: list[Row], mapping: Mapping, source: str) -> list[Row]:
    """`rows` with each mapped key set from its column; ValueError naming a row without it."""
    if not mapping:
        return rows
    out = []
    for i, row in enumerate(rows):
        new = dict(row)
        for key, column in mapping:
            try:
                new[key] = _lookup(row, column)
            except KeyError:
                raise ValueError(
                    f"{source}: row {i} has no column {column!r} (rows.columns: {key}={column}; "
                    f"its columns: {sorted(row)})"
                ) from None
        out.append(new)
    return out


def apply_active(rows: list[Row], source: str) -> list[Row]:
    """The rows with the mapping of the load in progress applied (see the module docstring)."""
    return remap(rows, _ACTIVE.get(), source)


def load_mapped(load: Callable[[str], list[Row]], mapping: Mapping, source: str) -> list[Row]:
    """`load(source)` with `mapping` applied to every row it reads through load_rows."""
    token = _ACTIVE.set(mapping)
    try:
        return load(source)
    finally:
        _ACTIVE.reset(token)
