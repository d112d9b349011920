"""Versioned weight directories the sampler reloads, written atomically.

Layout under a run dir:
    versions/v000003/       model.safetensors (or adapter_model.safetensors) + version.json;
                            a larger model: model-0000k-of-0000n.safetensors + their index
    LATEST                  "3\n", replaced atomically after the version dir is complete
A version dir appears only by rename of a finished temporary dir, and LATEST only ever names a
complete one, so a reader never sees half-written weights. version.json also lists each file's
size and checksum: a reader checks them (verify_version) and keeps its weights on a mismatch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpo.core.checksum import file_digest
from grpo.core.durable import as_umask_allows, fsync_path, fsync_tree, write_atomic

VERSION_MARKER = "version.json"


def version_dir(run_dir: Path, version: int) -> Path:
    return run_dir / "versions" / f"v{version:06d}"


def version_number(path: Path) -> int | None:
    """The version a dir named vNNNNNN holds, or None for any other name (a temporary dir)."""
    digits = path.name[1:]
    return int(digits) if path.name.startswith("v") and digits.isdigit() else None


def prune_versions(run_dir: Path, keep: int) -> None:
    """Remove all but the newest `keep` version dirs (by number: v1000000 follows v999999,
    which a sort by name would not say)."""
    numbered = []
    for path in (run_dir / "versions").glob("v*"):
        number = version_number(path)
        if number is not None and path.is_dir():
            numbered.append((number, path))
    for _, old in sorted(numbered)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def verify_version(vdir: Path) -> None:
    """Raise ValueError naming the problem unless every file version.json lists is intact."""
    try:
        files = json.loads((vdir / VERSION_MARKER).read_text())["files"]
    except FileNotFoundError:
        raise ValueError(f"{vdir} is missing or incomplete (no {VERSION_MARKER})") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{vdir / VERSION_MARKER} is unreadable: {e}") from None
    for name, want in files.items():
        try:
            got = file_digest(vdir / name)
        except OSError as e:
            raise ValueError(f"{vdir / name}: {e}") from None
        if got != want:
            raise ValueError(f"{vdir / name} is corrupt: {got} where version.json says {want}")


def publish_version(
    run_dir: Path, version: int, save: Callable[[Path], None], keep: int, step: int
) -> Path:
    """`save(tmp_dir)` writes the weights; the dir is renamed into place, then LATEST names it."""
    final = version_dir(run_dir, version)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(tmp)
    as_umask_allows(tmp)
    files = {p.name: file_digest(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    (tmp / VERSION_MARKER).write_text(
        json.dumps({"version": version, "step": step, "time": time.time(), "files": files})
    )
    # On the disk before LATEST names it: the files, the dir, and its rename into versions/.
    fsync_tree(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync_path(final.parent)
    write_atomic(run_dir / "LATEST", f"{version}\n")
    prune_versions(run_dir, keep)
    return final


def discard_versions_after(run_dir: Path, version: int) -> list[int]:
    """Remove versions newer than `version` (published by a run that crashed before saving
    its state; a resumed run republishes its own). Returns the removed version numbers."""
    removed = []
    for vdir in (run_dir / "versions").glob("v*"):
        number = version_number(vdir)
        if number is not None and number > version and vdir.is_dir():
            shutil.rmtree(vdir, ignore_errors=True)
            removed.append(number)
    return sorted(removed)


SHARD_INDEX = "model.safetensors.index.json"


def weight_files(vdir: Path) -> list[Path]:
    """The safetensors files of a version: one file, the shards its index names (save_pretrained
    splits a model larger than its max_shard_size), or the LoRA adapter."""
    if (vdir / SHARD_INDEX).is_file():
        try:
            weight_map = json.loads((vdir / SHARD_INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{vdir / SHARD_INDEX} is unreadable: {e}") from None
        shards = sorted(set(weight_map.values()))
        if any("/" in s or not (vdir / s).is_file() for s in shards):
            raise ValueError(f"{vdir / SHARD_INDEX} names shards that are not in {vdir}")
        return [vdir / s for s in shards]
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if (vdir / name).is_file():
            return [vdir / name]
    raise FileNotFoundError(
        f"no model.safetensors, {SHARD_INDEX} or adapter_model.safetensors in {vdir}"
    )


def load_state_dict(vdir: Path) -> dict[str, torch.Tensor]:
    """Full weights (one file or its shards) or a LoRA adapter, whichever the version holds."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(vdir):
        state.update(load_file(path))
    return state


def is_adapter(vdir: Path) -> bool:
    return (vdir / "adapter_model.safetensors").is_file()
