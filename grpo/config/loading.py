"""Building a Config: defaults <- YAML file <- `a.b=c` overrides, each value checked against
its field's annotation; and the way back (YAML, the key listing)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from grpo.config.bounds import check_waits
from grpo.config.errors import ConfigError
from grpo.config.passes import default_staleness
from grpo.config.peer_names import peer_key
from grpo.config.rules import check_values
from grpo.config.sections import Config
from grpo.core.paths import resolve_path
from grpo.core.precision import native_dtype


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; int -> float is the only silent conversion."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key} must be one of {_type_name(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce(value, inner, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        return _finite_float(value, key)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}")
    return value


def _finite_float(value: Any, key: str) -> float:
    """The one check every float key gets, wherever it is read from (YAML, overrides, a list
    entry): a finite number. NaN passes every later comparison (`nan <= 0` is False) and inf
    every upper bound, and no key means "no limit" by infinity (0 or null does, where a key
    has that meaning), so both are refused here rather than key by key."""
    number: float | None = None
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
    elif isinstance(value, str):
        # YAML 1.1 reads 1e-6 (no dot) as a string; a float field should still take it.
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None:
        raise ConfigError(f"{key} must be float, got {value!r}")
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return number


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            if (peer := peer_key(f"{prefix}{key}", value)) is not None:
                raise ConfigError(f"unknown config key '{prefix}{key}': {peer}")
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-5' -> ('train.lr', 1e-05); the value is read as YAML ('true', '[a, b]')."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except (yaml.YAMLError, RecursionError):  # kept as typed: the key's type check judges it
        value = raw
    return key.strip(), value


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file <- `a.b=c` overrides, validated; raises ConfigError."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {yaml_problem(e)}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p} is not valid YAML: {e}") from None
        except RecursionError:  # PyYAML's composer recurses once per level of nesting
            raise ConfigError(f"{p} is not valid YAML: nested too deeply") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{p} must hold a mapping of sections, got {type(tree).__name__}")
    for text in overrides:
        # `--resume` (launch.sh passes it to both roles) is short for train.resume=always.
        key, value = ("train.resume", "always") if text == "--resume" else parse_override(text)
        _set_dotted(tree, key, value)
    return settled(_build(Config, tree, ""))


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line, with where: its own text is four or five lines (the
    context, the problem, the position and the line marked with a caret), and a config error
    is one line."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if problem is None:
        return " ".join(str(e).split())
    context = getattr(e, "context", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{context + ': ' if context else ''}{problem}{where}"


def settled(cfg: Config) -> Config:
    """`cfg` with the defaults that depend on other keys worked out, then checked (ConfigError
    naming the key). Every Config a run uses comes through here."""
    if cfg.train.max_staleness is None:
        cfg.train.max_staleness = default_staleness(cfg)
    if cfg.model.dtype == "auto":
        cfg.model.dtype = native_dtype()
    resolve_user_paths(cfg)
    check_waits(cfg)
    check_values(cfg)
    return cfg


# The keys naming a file or directory the run reads (a hub id or 'embedded' is left as it is).
USER_PATHS = (
    "model.path", "data.train", "data.test", "train.deepspeed_config", "transport.curve_dir",
    "critic.model_path", "teacher.path", "reward_server.model",
)  # fmt: skip


def resolve_user_paths(cfg: Config) -> None:
    """Each relative path of USER_PATHS that exists, made absolute where grpo.core.paths finds
    it (where the user started the run, then the repository): launch.sh runs the roles from the
    repository, and every reader, in any process, then opens the same file."""
    for key in USER_PATHS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and not Path(value).is_absolute() and (found := resolve_path(value)).exists():
            setattr(getattr(cfg, section), name, str(found.absolute()))


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved config atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)


def describe(cls: type = Config, prefix: str = "") -> list[str]:
    """Every key with its default and help, for `python -m grpo.config --help-keys`."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{prefix}{f.name}:  # {f.metadata['help']}")
            lines += describe(tp, prefix + "  ")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"{prefix}{f.name}: {default!r}  # {f.metadata['help']}")
    return lines


def get_value(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not hasattr(node, part):
            raise ConfigError(f"unknown config key '{dotted}'")
        node = getattr(node, part)
    return node
