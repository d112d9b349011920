"""Mutations that must turn named tests red: proof that a check can fail.

Each `Mutation` breaks the code under test on purpose (one exact text replacement in one
file) and names the tests that must then fail. `python -m tests.mutations` applies each to a
copy of the checkout (never to the checkout itself), runs the named tests there and reports
whether they went red. It is slow (each mutation runs its tests in a fresh pytest), so it is a
reviewer's script, not part of the normal suite; `tests/test_mutations.py` checks only that
every mutation still applies to the code as it is.

The mutations live beside the areas they break, one module each (`episode.py`, `bench.py`,
...), each exporting `MUTATIONS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """Replace `old` (which must occur exactly once) by `new` in `path`; `tests` must fail."""

    name: str
    item: str  # which check of issue 33 it proves, e.g. "1: fuzz tests reach the parser"
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids, relative to the repository root
