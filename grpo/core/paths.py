"""Where a relative path in a config, or a user's module, is looked for: where the user stood
when starting the run, then the repository root.

launch.sh changes into the repository before it starts the roles (its scripts and the shipped
configs' paths live there); it first records where the user stood in GRPO_USER_DIR. Without it
(`python -m grpo ...`, the workers started by hand) the working directory is where they stand.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # grpo/core/paths.py -> the repository
USER_DIR_ENV = "GRPO_USER_DIR"


def user_dir() -> Path:
    """Where the user started the run from."""
    return Path(os.environ.get(USER_DIR_ENV) or os.getcwd())


def resolve_path(source: str | os.PathLike[str]) -> Path:
    """A relative path from where the user stands if it is there, else from the repository
    root if it is there, else as given (for the caller's 'not found' message)."""
    path = Path(source).expanduser()
    if path.is_absolute():
        return path
    for base in (user_dir(), Path.cwd(), REPO_ROOT):
        if (base / path).exists():
            return base / path
    return path
