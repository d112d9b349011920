"""docs/configuration.md, generated from the config dataclasses and the registries.

`python -m scripts.config_reference > docs/configuration.md` writes the page; tests/test_docs.py
fails when the page and the code disagree. Everything on the page comes from the code: each
key's type annotation, default and `help`, and the keyword defaults of each policy loss's
signature (the one place those defaults are written).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal

from grpo.config.sections import Config
from grpo.plan import LOSS_OPTIONS

REGENERATE = ".venv/bin/python -m scripts.config_reference > docs/configuration.md"

# The keyword options the trainer passes to a policy loss (None = the loss's own default).

_HEADER = f"""\
# Configuration reference

Generated from the config dataclasses (`grpo/config/sections.py`) and the registries by
`scripts/config_reference.py`; do not edit it by hand. Regenerate it after changing a key, a
default, a help text or a registered name:

```bash
{REGENERATE}
```

`tests/test_docs.py` fails when this page and the code disagree.

A run's config is built in three layers: the defaults below, then the YAML file, then
`section.key=value` overrides on the command line (values are read as YAML:
`'model.lora.target_modules=[q_proj, v_proj]'`). The same overrides work for `launch.sh`,
`sampling_worker.py` and `training_worker.py`. An unknown key is an error naming the closest
valid one; a value of the wrong type, or outside what the key allows, is an error naming the key.
Every float must be a finite number: NaN and infinity are refused (where a key can mean "no
limit", 0 or `null` says so). Every wait (a key ending in `_s` or `_ms`) is at least 0 and at
most 2147483 s, ZeroMQ's limit, and `transport.heartbeat_s` at least 0.01 s.
Names of a loss, an advantage estimator, a task or a rollout engine are checked against the
registries before a run starts (by `launch.sh`, by `python -m grpo check CONFIG`, and
again at worker start-up). `python training_worker.py --help-keys` prints the same keys as
YAML with their defaults.

`null` in the YAML is Python's `None`.
"""

_LOSS_NOTE = """\
A policy loss's keyword defaults are its defaults, read from its signature: `algo.agg`,
`algo.clip_low` and `algo.clip_high` left at `null` take the values below for the loss that
`algo.loss` names, and `algo.clip_c: null` means no dual clip. An option left at `null` that
the loss does not declare, or declares without a default, is not passed to it.
"""

# ----------------------------------------------------------------------------- formatting


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    """Text for a table cell: `|` escaped everywhere (GFM splits cells first); outside code
    spans `<` (it would open an HTML tag) and `*` (emphasis) escaped too."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|").replace("\n", " ")


def _value(value: Any) -> str:
    """A default as it would be written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return repr(value)


def _type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(_code(str(a)) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [_type(a) for a in args if a is not type(None)]
        return " or ".join(inner) + (" or `null`" if type(None) in args else "")
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"list of {_type(item)}"
    return getattr(tp, "__name__", str(tp))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _sentence(text: str) -> str:
    """A help text as a sentence: capitalised, unless it starts with a name such as vLLM."""
    if text[:1].islower() and not text[1:2].isupper():
        text = text[0].upper() + text[1:]
    return _cell(text) + "."


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


# ----------------------------------------------------------------------------- config sections


def _sections(
    cls: type, prefix: str, help: str
) -> Iterator[tuple[str, str, list[tuple[str, ...]]]]:
    """(dotted section name, its help, rows of its own keys), the section first, then each
    nested section in field order."""
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((tp, f"{prefix}{f.name}", f.metadata["help"]))
        else:
            rows.append(
                (
                    _code(prefix + f.name),
                    _type(tp),
                    _code(_value(_default(f))),
                    f.metadata["help"],
                )
            )
    yield prefix.rstrip("."), help, rows
    for tp, name, sub_help in nested:
        yield from _sections(tp, name + ".", sub_help)


def _config_tables() -> list[str]:
    lines: list[str] = []
    for name, help, rows in _sections(Config, "", "the run's name and where its outputs go"):
        lines += ["", f"## `{name}`" if name else "## Top level", ""]
        lines += [_sentence(help), ""]
        lines += _table(("key", "type", "default", "meaning"), rows)
    return lines


# ----------------------------------------------------------------------------- registries


def _builtin(obj: Any) -> bool:
    """Shipped with the package (a test or a user may register more at run time)."""
    if isinstance(obj, str):  # a lazily imported factory, 'package.module:name'
        return obj.startswith("grpo.")
    return getattr(obj, "__module__", "").startswith("grpo.")


def _qualname(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _summary(fn: Callable) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _loss_rows() -> list[tuple[str, ...]]:
    from grpo.algos.registry import POLICY_LOSSES

    rows = []
    for name in POLICY_LOSSES:
        fn = POLICY_LOSSES.entry(name)
        if not _builtin(fn):
            continue
        params = inspect.signature(fn).parameters
        cells = []
        for option in LOSS_OPTIONS:
            p = params.get(option)
            if p is None:
                cells.append("not taken")
            elif p.default is inspect.Parameter.empty:
                cells.append("required")
            else:
                cells.append(_code(_value(p.default)))
        rows.append((_code(name), _code(_qualname(fn)), *cells))
    return rows


def _advantage_rows() -> list[tuple[str, ...]]:
    from grpo.algos import gae
    from grpo.algos.registry import ADVANTAGE_ESTIMATORS, TOKEN_ADVANTAGE_ESTIMATORS
    from grpo.core.vocabulary import GAE

    rows = []
    for table, kind in (
        (ADVANTAGE_ESTIMATORS, "outcome: rewards (N,) -> (N,)"),
        (TOKEN_ADVANTAGE_ESTIMATORS, "token: rewards (B, T) -> (B, T)"),
    ):
        for name in table:
            fn = table.entry(name)
            if _builtin(fn):
                rows.append((_code(name), kind, _code(_qualname(fn)), _summary(fn)))
    rows.append(
        (
            _code(GAE),
            "token, with the critic's values (the `critic` section)",
            _code(_qualname(gae)),
            _summary(gae),
        )
    )
    return rows


def _task_rows() -> list[tuple[str, ...]]:
    from grpo.tasks import get_task, task_names

    rows = []
    for name in task_names():
        task = get_task(name)
        if _builtin(task.reward):
            rows.append((_code(name), _code(task.default_train), _code(task.default_test)))
    return rows


def _engine_rows() -> list[tuple[str, ...]]:
    from grpo.rollout.registry import ENGINES

    rows = []
    for name in ENGINES:
        factory = ENGINES.entry(name)
        if _builtin(factory):
            where = factory if isinstance(factory, str) else _qualname(factory)
            rows.append((_code(name), _code(where)))
    return rows


def _tool_rows() -> list[tuple[str, ...]]:
    from grpo.tools import get_tool, tool_names

    rows = []
    for name in tool_names():
        tool = get_tool(name)
        if _builtin(tool.run):
            call = _code(f"{tool.open_tag}...{tool.close_tag}")
            rows.append((_code(name), call, _code(_qualname(tool.run)), _summary(tool.run)))
    return rows


def _registry_tables() -> list[str]:
    lines = ["", "## Policy losses and their defaults", "", *_LOSS_NOTE.splitlines(), ""]
    lines += _table(("`algo.loss`", "function", *(_code(o) for o in LOSS_OPTIONS)), _loss_rows())
    lines += ["", "## Advantage estimators", ""]
    lines += [
        "`algo.advantage` takes one of these names, or your own estimator as",
        "`package.module:function` (an outcome estimator unless its module registered it with",
        "`grpo.algos.registry.register_token_advantage_estimator`).",
        "",
    ]
    lines += _table(("`algo.advantage`", "kind", "function", "what"), _advantage_rows())
    lines += ["", "## Tasks", ""]
    lines += [
        "`data.task` takes one of these names, or your own `grpo.tasks.Task` as",
        "`package.module:name`. `data.train` / `data.test` left at `''` use the defaults below.",
        "",
    ]
    lines += _table(("`data.task`", "default train rows", "default test rows"), _task_rows())
    lines += ["", "## Rollout engines", ""]
    lines += [
        "`rollout.backend` takes one of these names, or your own factory",
        "`build(ctx: grpo.rollout.base.EngineContext) -> RolloutEngine` as",
        "`package.module:name`. A built-in engine's module is imported only when it is chosen.",
        "",
    ]
    lines += _table(("`rollout.backend`", "factory"), _engine_rows())
    lines += ["", "## Tools", ""]
    lines += [
        "`rollout.tools` (with `rollout.max_turns` > 1) takes these names, or your own",
        "`grpo.tools.Tool` as `package.module:name`: the model writes the call, the result comes",
        "back as `<result>...</result>` ([tools.md](tools.md)).",
        "",
    ]
    lines += _table(("`rollout.tools`", "call", "function", "what"), _tool_rows())
    return lines


def markdown() -> str:
    """The whole of docs/configuration.md."""
    import grpo.algos  # noqa: F401  (registers the built-in losses and estimators)

    lines = _HEADER.splitlines() + _config_tables() + _registry_tables()
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
