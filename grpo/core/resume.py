"""A resume's first check: what it takes up (a training state, a sampler's shard) was saved by
a run whose settings fingerprint is this run's."""

from __future__ import annotations

from typing import Any


def require_same(saved: dict[str, Any], current: dict[str, Any], what: str, fix: str) -> None:
    """Refuse to resume `what` if any key differs between its saved and current fingerprint."""
    for key, value in current.items():
        if saved.get(key) != value:
            raise ValueError(
                f"cannot resume {what}: it was saved with {key}={saved.get(key)!r}, this run "
                f"has {key}={value!r}; {fix}"
            )
