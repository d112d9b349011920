"""Rollout engines by name: `rollout.backend` is a name here or a user's `package.module:factory`.

The built-in engines are named by where their factory lives, so that looking a name up does
not import vLLM (or anything heavy) until that engine is asked for.
"""

from __future__ import annotations

from grpo.core.registry import Registry
from grpo.rollout.base import EngineFactory

ENGINES: Registry[EngineFactory] = Registry("rollout engine", callable, "a factory")
ENGINES.add("hf", "grpo.rollout.hf:build")
ENGINES.add("vllm", "grpo.rollout.vllm:build")

# rollout.mode: continuous (grpo.rollout.continuous.ContinuousEngine), by rollout.backend.
CONTINUOUS: Registry = Registry("continuous rollout engine", callable, "a factory")
CONTINUOUS.add("hf", "grpo.rollout.hf_continuous:build_continuous")
CONTINUOUS.add("vllm", "grpo.rollout.vllm_continuous:build_continuous")


def register_engine(name: str, factory: EngineFactory) -> EngineFactory:
    """Add an engine factory under `name`; a name clash is an error, never an overwrite."""
    ENGINES.add(name, factory)
    return factory


check_engine_name = ENGINES.check
get_engine = ENGINES.get
get_continuous_engine = CONTINUOUS.get
