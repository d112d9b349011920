"""Mutations that must turn named tests red: proof that a check can fail.

Each `Mutation` breaks the code under test on purpose (one exact text replacement in one
file) and names the tests that must then fail. `python -m tests.mutations` applies each to a
copy of the checkout (never to the checkout itself), runs the named tests there and reports
whether they went red. It is slow (each mutation runs its tests in a fresh pytest), so it is a
reviewer's script, not part of the normal suite; `tests/test_mutations.py` checks that every
mutation still applies to the code as it is and names at least one test of CI's tier (no
guarantee rests on the extended tier alone). The script reports which tier caught each.

The mutations live beside the areas they break, one module each (`episode.py`, `bench.py`,
...), each exporting `MUTATIONS`.
"""

from __future__ import annotations

import importlib
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


def marks_of(node: str) -> set[str]:
    """The names of the marks on the test `node` (a pytest node id relative to the repository
    root) and on its module."""
    path, _, name = node.partition("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    fn = getattr(module, name.split("[")[0])
    module_marks = getattr(module, "pytestmark", [])
    if not isinstance(module_marks, list):
        module_marks = [module_marks]
    marks = [*getattr(fn, "pytestmark", []), *module_marks]
    param_id = name.partition("[")[2].removesuffix("]")
    for mark in marks:  # a pytest.param(..., marks=...) of the parametrized case named
        if mark.name == "parametrize" and param_id:
            for case in mark.args[1]:
                if getattr(case, "id", None) == param_id or (
                    hasattr(case, "values") and "-".join(map(str, case.values)) == param_id
                ):
                    marks.extend(case.marks)
    return {m.name for m in marks}


def in_ci_tier(node: str) -> bool:
    """Whether CI's run (no --extended) runs `node` (tests/conftest.py deselects `extended`)."""
    return "extended" not in marks_of(node)
