"""Versioned weight directories the sampler reloads, written atomically.

Layout under a run dir:
    versions/v000003/       model.safetensors (or adapter_model.safetensors) + version.json
    LATEST                  "3\n", replaced atomically after the version dir is complete
A version dir appears only by rename of a finished temporary dir, and LATEST only ever names a
complete one, so a reader never sees half-written weights.
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

VERSION_MARKER = "version.json"


def version_dir(run_dir: Path, version: int) -> Path:
    return run_dir / "versions" / f"v{version:06d}"


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def publish_version(
    run_dir: Path, version: int, save: Callable[[Path], None], keep: int, step: int
) -> Path:
    """`save(tmp_dir)` writes the weights; the dir is renamed into place, then LATEST names it."""
    final = version_dir(run_dir, version)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save(tmp)
    (tmp / VERSION_MARKER).write_text(
        json.dumps({"version": version, "step": step, "time": time.time()})
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_text_atomic(run_dir / "LATEST", f"{version}\n")
    _prune(run_dir, keep)
    return final


def _prune(run_dir: Path, keep: int) -> None:
    versions = sorted(p for p in (run_dir / "versions").glob("v*") if p.is_dir())
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_version(run_dir: Path) -> int | None:
    """The newest complete version, or None before the first publish."""
    try:
        version = int((run_dir / "LATEST").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not (version_dir(run_dir, version) / VERSION_MARKER).is_file():
        return None
    return version


def load_state_dict(vdir: Path) -> dict[str, torch.Tensor]:
    """Full weights or a LoRA adapter, whichever the version dir holds."""
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if (vdir / name).is_file():
            return load_file(vdir / name)
    raise FileNotFoundError(f"no model.safetensors or adapter_model.safetensors in {vdir}")


def is_adapter(vdir: Path) -> bool:
    return (vdir / "adapter_model.safetensors").is_file()
