"""Datasets as users have them on disk, besides single files (grpo.tasks.base): a directory that
`datasets.Dataset.save_to_disk` wrote, a downloaded hub repository (parquet / jsonl / json files,
under ``data/`` or wherever its README's configs say), and a hub name read from the local
Hugging Face cache when the hub cannot be reached.

Directories and hub names pick a split the same way: ``source[:config][:split]`` for hub names,
``dir[:split]`` or ``dir:config:split`` for directories (a directory's single suffix is its
split: a saved dataset has no configs, and most repositories have one). No split named means
``train``; a source with one split only has that one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Row = dict[str, Any]

# The files `save_to_disk` leaves: a DatasetDict's index, or a single Dataset's state.
_SAVED_MARKERS = ("dataset_dict.json", "state.json")
# Set, the hub is not asked at all: the cache is the only place a hub name is looked up.
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def split_suffix(source: str, resolve: Any) -> tuple[Path, str, str] | None:
    """``(dir, config, split)`` when `source` is an existing directory, with or without a
    ``:split`` / ``:config:split`` suffix; None otherwise. `resolve` finds relative paths."""
    head, parts = source, []
    while True:
        path = resolve(head)
        if path.is_dir():
            break
        head, sep, tail = head.rpartition(":")
        if not sep or len(parts) == 2:
            return None
        parts.insert(0, tail)
    config, split = (parts[0], parts[1]) if len(parts) == 2 else ("", "".join(parts))
    return path, config, split


def _rows(table: Any) -> list[Row]:
    return [dict(r) for r in table.to_list()]


def _pick_split(splits: Any, split: str, where: str) -> Any:
    """The split asked for (or the only one, or ``train``) of a DatasetDict."""
    names = list(splits.keys())
    if not split:
        split = names[0] if len(names) == 1 else "train"
    if split not in names:
        raise ValueError(f"{where} has no split {split!r}; its splits: {', '.join(names)}")
    return splits[split]


def load_directory(path: Path, config: str, split: str) -> list[Row]:
    """The rows of one split of a dataset directory (see the module docstring)."""
    import datasets  # lazy: heavy, and single files do not need it

    if any((path / marker).is_file() for marker in _SAVED_MARKERS):
        if config:
            raise ValueError(f"{path} was written by save_to_disk: it has no configs ({config!r})")
        require_inside(path)
        saved = datasets.load_from_disk(str(path))
        if isinstance(saved, datasets.DatasetDict):
            return _rows(_pick_split(saved, split, str(path)))
        return _rows(saved)  # one Dataset: no split to choose
    try:
        found = datasets.load_dataset(str(path), config or None)
    except Exception as exc:  # no data files, a config it does not have, unreadable files
        raise ValueError(
            f"could not read dataset directory {str(path)!r}: {type(exc).__name__}: {exc}"
        ) from exc
    return _rows(_pick_split(found, split, str(path)))


def _inside(root: Path, name: Any, what: str) -> Path:
    """`root / name`, refused when it resolves (symbolic links followed) outside `root`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} names {name!r}, not a file name")
    target = (root / name).resolve()
    if not target.is_relative_to(root.resolve()):
        raise ValueError(f"{what} names {name!r}, outside {root}: refused")
    return target


def _listed(index: Path, key: str) -> list[Any]:
    """The list `key` of JSON file `index` (one line naming it when it is not one)."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{index}: not readable JSON ({exc})") from exc
    listed = data.get(key) if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise ValueError(f"{index}: no list {key!r}")
    return listed


def require_inside(path: Path) -> None:
    """A `save_to_disk` directory reads only files inside it: its index names split folders
    and arrow files, and `datasets` would follow a name such as ``../../other.arrow``."""
    index = path / "dataset_dict.json"
    splits = (
        [_inside(path, s, str(index)) for s in _listed(index, "splits")]
        if index.is_file()
        else [path]
    )
    for split in splits:
        state = split / "state.json"
        for entry in _listed(state, "_data_files"):
            name = entry.get("filename") if isinstance(entry, dict) else entry
            _inside(split, name, str(state))


def offline() -> bool:
    """Whether the user said the hub is out of reach (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in _OFFLINE_ENV)


def cached_snapshot(name: str) -> Path | None:
    """The local copy of hub dataset `name` in the Hugging Face cache (HF_HOME, HF_HUB_CACHE),
    as a download left it; None when it was never downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, repo_type="dataset", local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def load_cached(name: str, config: str, split: str) -> list[Row] | None:
    """A hub dataset's rows from the local cache, or None when it is not there."""
    snapshot = cached_snapshot(name)
    return None if snapshot is None else load_directory(snapshot, config, split)
