"""Rollout engines by name: `rollout.backend` is a name here or a user's `package.module:factory`.

The built-in engines are named by where their factory lives, so that looking a name up does
not import vLLM (or anything heavy) until that engine is asked for.
"""

from __future__ import annotations

from grpo.core.plugins import load_object, resolve
from grpo.rollout.base import EngineFactory

ENGINES: dict[str, EngineFactory | str] = {
    "hf": "grpo.rollout.hf:build",
    "vllm": "grpo.rollout.vllm:build",
}


def register_engine(name: str, factory: EngineFactory) -> EngineFactory:
    """Add an engine factory under `name`; a name clash is an error, never an overwrite."""
    if name in ENGINES:
        raise ValueError(f"rollout engine {name!r} is already registered")
    ENGINES[name] = factory
    return factory


def check_engine_name(name: str) -> None:
    """ValueError unless `name` is a built-in engine or a user's importable factory; a built-in
    is not imported (launch.sh's up-front check should not pay for transformers or vLLM)."""
    if name not in ENGINES or not isinstance(ENGINES[name], str):
        get_engine(name)


def get_engine(name: str) -> EngineFactory:
    """The factory for `rollout.backend`; the error lists the valid names."""
    factory = resolve(ENGINES, "rollout engine", name)
    if isinstance(factory, str):  # a built-in, imported now
        factory = load_object(factory, "rollout engine")
    if not callable(factory):
        raise ValueError(f"rollout engine {name!r} is a {type(factory).__name__}, not a factory")
    return factory
