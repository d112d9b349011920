"""Names in the config that pick an implementation: a registered name, or a user's own object as
`package.module:attr` (a reward, a policy loss, an advantage estimator, a task, a tool, a
rollout engine, a reward backend).

One registry type for every plug-in kind, so all of them answer alike: the same error naming
the valid names and the closest one, the same `package.module:name` loading, and a second
registration of a name refused (two modules must never shadow each other silently, depending on
import order).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from grpo.core.paths import user_dir

T = TypeVar("T")
F = TypeVar("F")


def _import_module(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Console scripts and `python path/to/script.py` do not put the working dir on
        # sys.path, and launch.sh runs the roles from the repository: a user's `my_rewards:fn`
        # where they started the run would not be found. Retry once with that directory
        # appended (appended, so it cannot shadow installed packages).
        top = module_name.split(".")[0]
        where = str(user_dir())
        if exc.name != top or where in sys.path:
            raise
        sys.path.append(where)
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


class Registry(Generic[T]):
    """Name -> implementation of one plug-in kind.

    An entry is the object itself, or a `package.module:attr` string for a built-in that is
    imported only when asked for (vLLM's engine must not be imported to check a name).
    `accepts` says what an implementation of this kind is; `expected` names it in errors."""

    def __init__(self, kind: str, accepts: Callable[[Any], bool], expected: str):
        self.kind = kind
        self._accepts = accepts
        self._expected = expected
        self._entries: dict[str, T | str] = {}

    def add(self, name: str, entry: T | str) -> None:
        """Register `entry` under `name`; ValueError if the name is taken."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator form of :meth:`add`."""

        def decorator(obj: F) -> F:
            self.add(name, obj)  # type: ignore[arg-type]
            return obj

        return decorator

    def merged(self, other: Registry[T]) -> Registry[T]:
        """One registry answering for both (named as this one), for a config key that takes
        either kind."""
        both: Registry[T] = Registry(self.kind, self._accepts, self._expected)
        both._entries = self._entries | other._entries
        return both

    def remove(self, name: str) -> None:
        """Forget `name` (a test's own registration, undone)."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def entry(self, name: str) -> T | str:
        """What is registered under `name`, a lazy built-in's spec not imported."""
        return self._entries[name]

    def get(self, name: str) -> T:
        """The implementation `name` picks: a registered one, or the object a
        `package.module:attr` spec names; ValueError naming the valid names otherwise."""
        if name in self._entries:
            found: Any = self._entries[name]
            if isinstance(found, str):  # a built-in, imported now
                found = load_object(found, self.kind)
        elif ":" in name:
            found = load_object(name, self.kind)
        else:
            close = difflib.get_close_matches(name, list(self._entries), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}, or your own "
                f"as 'package.module:name'{hint}"
            )
        if not self._accepts(found):
            raise ValueError(
                f"{self.kind} {name!r} is a {type(found).__name__}, not {self._expected}"
            )
        return found

    def check(self, name: str) -> None:
        """:meth:`get`'s errors, without importing a built-in registered by its spec (the
        up-front check of a config should not pay for transformers or vLLM)."""
        if not isinstance(self._entries.get(name), str):
            self.get(name)
