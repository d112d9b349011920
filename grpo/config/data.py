"""How a dataset's rows are read when their columns are not named as the task reads them
(grpo.tasks.columns)."""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config.fields import knob


@dataclass
class RowsConfig:
    columns: list[str] = knob(
        [],
        "column mapping, 'key=column' per entry: every row gets the task's key from that "
        "column, a dotted path into nested ones (e.g. [question=problem, "
        "answer=reward_model.ground_truth]); the row's own columns stay; [] = none",
    )


Mapping = tuple[tuple[str, str], ...]


def parse_columns(entries: list[str]) -> Mapping:
    """``(key, column path)`` pairs of ``key=column`` entries; ValueError naming a bad one."""
    pairs = []
    for entry in entries:
        key, sep, column = (part.strip() for part in str(entry).partition("="))
        if not sep or not key or not column or any(not p for p in column.split(".")):
            raise ValueError(f"entry {entry!r}: expected 'key=column' (or 'key=column.nested')")
        pairs.append((key, column))
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        raise ValueError(f"a key is mapped twice: {entries}")
    return tuple(pairs)


def check_rows(rows: RowsConfig) -> None:
    """ConfigError naming rows.columns when an entry is not ``key=column``."""
    from grpo.config.checks import ConfigError  # here: checks imports this module

    try:
        parse_columns(rows.columns)
    except ValueError as e:
        raise ConfigError(f"rows.columns: {e}") from None
