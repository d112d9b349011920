"""Every mutation, gathered from the area modules of this package (each exports MUTATIONS)."""

from __future__ import annotations

import importlib
import pkgutil

import tests.mutations as package
from tests.mutations import Mutation


def _gather() -> tuple[Mutation, ...]:
    found: list[Mutation] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name not in ("__main__", "catalogue"):
            found.extend(importlib.import_module(f"{package.__name__}.{info.name}").MUTATIONS)
    return tuple(found)


ALL = _gather()
