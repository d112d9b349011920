"""Names in the config that pick an implementation: a registered name, or a user's own object as
`package.module:attr` (a reward, a policy loss, an advantage estimator, a task, a rollout engine).

One rule for all of them, so that adding one is writing one file and naming it in the config.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any


def _import_module(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Console scripts and `python path/to/script.py` do not put the working dir on
        # sys.path, so a user's `my_rewards:fn` next to their config would not be found.
        # Retry once with it appended (appended, so it cannot shadow installed packages).
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)


def load_object(spec: str, what: str) -> Any:
    """The object a ``"package.module:attr"`` spec names (``attr`` may be dotted); ValueError
    naming `what` and the spec when it cannot be imported."""
    module_name, sep, attr = spec.strip().partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise ValueError(
            f"bad {what} spec {spec!r}: expected 'package.module:name', e.g. 'my_pkg.mine:name'"
        )
    try:
        module = _import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"could not import {what} module {module_name!r} ({spec!r}): {exc}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):  # allows "module:Class.staticmethod"
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ValueError(
                f"{what} module {module_name!r} has no attribute {attr!r} ({spec!r})"
            ) from exc
    return obj


def resolve(table: Mapping[str, Any], what: str, name: str) -> Any:
    """`table[name]`, or the object `name` names when it is a `package.module:attr` spec."""
    if name in table:
        return table[name]
    if ":" in name:
        return load_object(name, what)
    close = difflib.get_close_matches(name, list(table), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown {what} {name!r}; valid: {', '.join(sorted(table))}, or your own as "
        f"'package.module:name'{hint}"
    )
