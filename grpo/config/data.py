"""How a dataset's rows are read when their columns are not named as the task reads them
(grpo.tasks.columns)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo.config.errors import ConfigError
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
    try:
        parse_columns(rows.columns)
    except ValueError as e:
        raise ConfigError(f"rows.columns: {e}") from None


# ---------------------------------------------------------------------------
# Mixtures (data.mixture): several datasets in one run, each with its own task and reward
# ---------------------------------------------------------------------------

MIXTURE_KEYS = ("name", "train", "test", "task", "reward", "weight")
# A source name becomes part of metric keys (accuracy/<name>): no spaces, no '='.
_NAME = re.compile(r"[\w.\-/]+")


@dataclass(frozen=True)
class MixtureEntry:
    """One dataset of a mixture, its defaults filled in (see DataConfig.mixture)."""

    name: str
    train: str
    test: str  # '' = its task's default test split
    task: str
    reward: str  # '' = its task's reward
    weight: float


def _entry(raw: Any, default_task: str) -> MixtureEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"expected a mapping like {{train: ..., weight: 1}}, got {raw!r:.80}")
    unknown = sorted(set(map(str, raw)) - set(MIXTURE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (keys: {', '.join(MIXTURE_KEYS)})")
    strings = {k: raw.get(k, "") for k in ("name", "train", "test", "task", "reward")}
    for key, value in strings.items():
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r:.80}")
    if not strings["train"]:
        raise ValueError("no train rows: set train (a file, a directory or a hub name)")
    if strings["reward"] and ":" not in strings["reward"]:
        raise ValueError(
            f"reward must look like 'package.module:function', got {strings['reward']!r}"
        )
    weight = raw.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ValueError(f"weight must be a number, got {weight!r:.80}")
    if not (math.isfinite(weight) and weight > 0):
        raise ValueError(f"weight must be a finite number > 0, got {weight!r}")
    task = strings["task"] or default_task
    name = strings["name"] or task
    if not _NAME.fullmatch(name):
        raise ValueError(f"name {name!r} must be letters, digits and _ . - / only (a metric key)")
    return MixtureEntry(
        name, strings["train"], strings["test"], task, strings["reward"], float(weight)
    )


def parse_mixture(entries: list[Any], default_task: str) -> tuple[MixtureEntry, ...]:
    """The entries of data.mixture, checked; ValueError 'entry i: why' for a bad one."""
    parsed = []
    for i, raw in enumerate(entries):
        try:
            parsed.append(_entry(raw, default_task))
        except ValueError as e:
            raise ValueError(f"entry {i}: {e}") from None
    names = [e.name for e in parsed]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f"entry {i}: a second entry named {name!r}: give each a name")
    return tuple(parsed)


def check_mixture(mixture: list[Any], task: str, train: str, test: str, reward: str) -> None:
    """ConfigError in one line for a bad data.mixture: an entry (see parse_mixture), or
    data.train / test / reward set beside it (each entry has its own). Its tasks are looked up
    with the run's names (grpo.tasks.mixture.sources): this layer knows no tasks."""
    if not mixture:
        return
    for key, value in (("train", train), ("test", test), ("reward", reward)):
        if value:
            raise ConfigError(
                f"data.{key} is set beside data.mixture: set {key} in each mixture entry instead"
            )
    try:
        entries = parse_mixture(mixture, task)
    except ValueError as e:
        raise ConfigError(f"data.mixture: {e}") from None
    if len(entries) < 2:
        raise ConfigError(
            "data.mixture has one entry: a mixture needs two or more datasets "
            "(one dataset is data.task / data.train)"
        )


# ---------------------------------------------------------------------------
# Prompt variants (eval.prompt_variants): phrasings evaluation asks that training never used
# ---------------------------------------------------------------------------

VARIANT_KEYS = ("name", "instruction", "system_prompt")


@dataclass(frozen=True)
class Phrasing:
    """An evaluation's prompt variant: its name (in metric keys, `accuracy@<name>`), and the
    instruction and system prompt it puts in place of the run's (None: the run's own)."""

    name: str
    instruction: str | None = None
    system_prompt: str | None = None


def parse_variants(entries: Sequence[Any]) -> tuple[Phrasing, ...]:
    """`eval.prompt_variants`' entries, checked; ValueError 'entry i: why' for a bad one."""
    out: list[Phrasing] = []
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise ValueError(f"entry {i}: expected a mapping like {{name: a, instruction: ...}}")
        unknown = sorted(set(map(str, raw)) - set(VARIANT_KEYS))
        if unknown:
            keys = ", ".join(VARIANT_KEYS)
            raise ValueError(f"entry {i}: unknown key {unknown[0]!r} (keys: {keys})")
        name = raw.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"entry {i}: name must be a word (letters, digits, _): {name!r:.40}")
        if name in {p.name for p in out}:
            raise ValueError(f"entry {i}: a second variant named {name!r}")
        texts = {k: raw.get(k) for k in ("instruction", "system_prompt")}
        for key, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise ValueError(f"entry {i}: {key} must be a string, got {value!r:.40}")
        if texts["instruction"] is None and texts["system_prompt"] is None:
            raise ValueError(f"entry {i}: set instruction, system_prompt or both")
        out.append(Phrasing(name, texts["instruction"], texts["system_prompt"]))
    return tuple(out)
