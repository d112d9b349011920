"""Task definition, task registry, custom reward loading and dataset loading helpers."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from grpo.config.data import parse_columns
from grpo.core.paths import REPO_ROOT, resolve_path, user_dir
from grpo.core.registry import Registry, load_object
from grpo.runtime.refusals import note

from . import columns, conventions, sources

Row = dict[str, Any]
RewardFn = Callable[[str, Row], float | tuple[float, dict]]

logger = logging.getLogger("grpo.reward")

# grpo/tasks/base.py -> the repository root holds `grpo/`, `data/`, `configs/`.

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Task:
    """Everything the pipeline needs to train and evaluate on one dataset."""

    name: str
    load: Callable[[str], list[Row]]
    build_messages: Callable[[Row, str], list[dict[str, str]]]
    reward: RewardFn
    default_train: str
    default_test: str
    # How many answer markers an answer holds (`#### N`, `\\boxed{}`...), for the degeneration
    # measures (grpo.observe.degeneration); None: the task has no markers to count.
    count_markers: Callable[[str], int] | None = None
    # The answer instruction its questions end with, which data.instructions and
    # eval.prompt_variants may replace (grpo.tasks.phrasing); '' = none declared.
    instruction: str = ""


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------

TASKS: Registry[Task] = Registry("task", lambda t: isinstance(t, Task), "a grpo.tasks.Task")


def register_task(task: Task) -> Task:
    """Add a task to the registry; a name clash is an error, never an overwrite."""
    TASKS.add(task.name, task)
    return task


task_names = TASKS.names
get_task = TASKS.get


# ---------------------------------------------------------------------------
# Custom reward functions
# ---------------------------------------------------------------------------


def load_reward_fn(spec: str) -> RewardFn:
    """Import a reward function from a ``"package.module:function"`` spec: grpo's
    ``fn(completion, row)``, a verl ``compute_score`` or a TRL batched reward function (read from
    its signature, or declared as ``verl:package.module:function``), the last two wrapped to be
    called as the first (grpo.tasks.conventions)."""
    style, spec = conventions.split_style(spec)
    obj = load_object(spec, "reward")
    if not callable(obj):
        raise ValueError(
            f"reward {spec!r} is a {type(obj).__name__}, not a callable "
            "(expected fn(completion: str, row: dict) -> float | (float, dict), a verl "
            "compute_score or a TRL reward function)"
        )
    return conventions.adapt(obj, style, spec)


def reward_name(task: Task, spec: str) -> str:
    """The run's reward as errors name it: `data.reward`'s spec, or the task's."""
    return spec or f"of task {task.name}"


def run_reward(task: Task, spec: str) -> RewardFn:
    """The run's reward: `data.reward` (a `package.module:function` spec) when set, else the
    task's own (its signature checked as a user's)."""
    if not spec:
        conventions.require_callable_as(task.reward, "row", reward_name(task, spec))
    return load_reward_fn(spec) if spec else task.reward


def _json_scalar(value: Any) -> str | int | float | bool | None:
    """Make an info value msgpack/JSON friendly; numpy/torch scalars via .item()."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()
        except Exception:  # not a scalar (e.g. a multi-element array)
            return str(value)
        if value is None or isinstance(value, str | int | float | bool):
            return value
    return str(value)


def _normalize_reward(out: Any) -> tuple[float, dict]:
    """Turn a reward fn's return value into (finite float, clean info) or raise."""
    info: Any = {}
    value = out
    if isinstance(out, tuple):
        if len(out) != 2:
            raise TypeError(f"returned a tuple of length {len(out)}; expected (float, dict)")
        value, info = out
        if not isinstance(info, dict):
            raise TypeError(f"returned info of type {type(info).__name__}; expected dict")
    if not isinstance(value, numbers.Real):
        raise TypeError(f"returned {type(value).__name__}; expected float or (float, dict)")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"returned a non-finite reward {value}")
    return value, {str(k): _json_scalar(v) for k, v in info.items()}


def _fn_name(fn: Any) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}:{name}" if module else name


_failures = 0  # rewards that raised in this process (see score)


def score(reward_fn: RewardFn, completion: str, row: Row) -> tuple[float, dict]:
    """Call a reward fn and normalise its result; a failure scores 0.0 instead of raising.

    One broken sample (or a buggy user reward) must not kill a long training run, so
    errors are reported in the info dict and logged.
    """
    try:
        return _normalize_reward(reward_fn(completion, row))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        global _failures
        _failures += 1  # a reward failing on most answers would write a line for each
        note(
            logger,
            _failures,
            "reward function %s failed (%d times in this process so far): %s",
            _fn_name(reward_fn),
            _failures,
            error,
        )
        return 0.0, {"reward_error": error}


# ---------------------------------------------------------------------------
# Dataset loading
# ---------------------------------------------------------------------------


def _looks_local(source: str) -> bool:
    # "owner/name" is a Hugging Face id, so a single "/" is not enough to call it a path.
    if source.lower().endswith(LOCAL_SUFFIXES):
        return True
    if source.startswith(("/", "./", "../", "~", ".\\", "..\\")):
        return True
    return source.count("/") + (source.count(os.sep) if os.sep != "/" else 0) >= 2


def _read_jsonl(path: Path) -> list[Row]:
    rows: list[Row] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno}: invalid JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ValueError(
                    f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            rows.append(obj)
    return rows


def _read_json(path: Path) -> list[Row]:
    with path.open(encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    for i, obj in enumerate(data):
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: item {i}: expected a JSON object, got {type(obj).__name__}")
    return data


def _read_parquet(path: Path) -> list[Row]:
    import pyarrow.parquet as pq  # lazy: only needed for parquet sources

    return pq.read_table(path).to_pylist()


_READERS: dict[str, Callable[[Path], list[Row]]] = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
}


def _read_local(path: Path) -> list[Row]:
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(
            f"unsupported dataset file {str(path)!r}: expected one of {', '.join(LOCAL_SUFFIXES)}"
        )
    return reader(path)


def _load_hf(source: str, split: str | None) -> list[Row]:
    """Load ``name[:config[:split]]`` from the Hugging Face hub, or from the local HF cache when
    the hub is out of reach (HF_HUB_OFFLINE set, or the download failed)."""
    name, _, rest = source.partition(":")
    config, _, spec_split = rest.partition(":")
    split = split or spec_split or "train"
    if sources.offline():
        rows = sources.load_cached(name, config, split)
        if rows is not None:
            return rows
        raise ValueError(
            f"dataset {source!r} is not in the local Hugging Face cache ({_cache_dir()}) and the "
            "hub is off (HF_HUB_OFFLINE): download it once online, or pass a local file or "
            "directory (e.g. data/gsm8k/train.jsonl)"
        )
    try:
        import datasets  # lazy: heavy import, and unused for local files

        ds = datasets.load_dataset(name, config or None, split=split)
        return [dict(r) for r in ds]
    except Exception as exc:
        rows = sources.load_cached(name, config, split)
        if rows is not None:
            logger.warning("dataset %s: the hub failed (%s); read from the local cache", name, exc)
            return rows
        raise ValueError(
            f"could not load dataset {source!r} (split {split!r}) with `datasets`: "
            f"{type(exc).__name__}: {exc}. Offline machines cannot reach the Hugging Face hub, "
            f"and it is not in the local cache ({_cache_dir()}); pass a local .jsonl/.json/"
            ".parquet file or dataset directory instead (e.g. data/gsm8k/train.jsonl)."
        ) from exc


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def load_rows_with(source: str, keys: tuple[str, ...]) -> list[Row]:
    """`load_rows`, checking that every row has `keys`, none of them null (one line naming the
    row otherwise: a null question would be asked as the text "None")."""
    rows = load_rows(source)
    for i, row in enumerate(rows):
        for key in keys:
            if key not in row:
                raise ValueError(
                    f"{source}: row {i} has no {key!r} key (keys: {sorted(row)}); name the "
                    f"column that holds it with rows.columns=[{key}=<column>]"
                )
            if row[key] is None:
                raise ValueError(f"{source}: row {i} has a null {key!r}")
    return rows


def question_messages(question: str, instruction: str, system_prompt: str) -> list[dict[str, str]]:
    """The chat of a question-and-answer task: the system prompt (if any), then the question
    followed by the task's answer instruction."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": f"{question.strip()}\n\n{instruction}"})
    return messages


def locate(source: str) -> Path | tuple[Path, str, str] | None:
    """Where `source` is read from: a local file, a dataset directory (dir, config, split), or
    None for a hub name; FileNotFoundError when it names a local path that is not there."""
    path = resolve_path(source)
    if path.is_file():
        return path
    if (found := sources.split_suffix(source, resolve_path)) is not None:
        return found
    if _looks_local(source):
        raise FileNotFoundError(
            f"dataset file not found: {source!r} (looked relative to {user_dir()} "
            f"and to the repo root {REPO_ROOT})"
        )
    return None


def load_rows(source: str, split: str | None = None) -> list[Row]:
    """Load rows from a local .jsonl/.json/.parquet file, a dataset directory (``dir[:split]``,
    grpo.tasks.sources) or a Hugging Face dataset name (``name[:config[:split]]``).

    Local files ignore ``split``; `split` is the default for hub names.
    """
    source = str(source)
    if not source.strip():
        raise ValueError("no dataset named: set data.train / data.test (this task has no default)")
    where = locate(source)
    if isinstance(where, Path):
        rows = _read_local(where)
    elif where is not None:
        rows = sources.load_directory(*where)
    else:
        rows = _load_hf(source, split)
    if not rows:
        raise ValueError(f"dataset {source!r} is empty")
    return columns.apply_active(rows, source)


def mapped(task: Task, entries: list[str]) -> Task:
    """`task` reading its rows through the column mapping `entries` (rows.columns,
    grpo.tasks.columns); the task itself if there is none."""
    if not entries:
        return task
    load = partial(columns.load_mapped, task.load, parse_columns(entries))
    return dataclasses.replace(task, load=load)
