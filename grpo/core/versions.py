"""Where a published version lives in a run dir, and how a reader knows it is whole.

    versions/v000003/       the weights' files + version.json, which lists each file's size and
                            checksum (written last, so a dir without it is unfinished)

Both ends rely on these facts: the trainer publishing (grpo.weights.dirs) and the weight
stream copying a version to a sampler with no shared filesystem (grpo.wire.weight_stream).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grpo.core.checksum import file_digest

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
