"""What the config's checks know of each rollout engine: its abilities, declared once per
built-in engine, and asked by the checks and the placement instead of the engine's name.
grpo.rollout.registry registers the same names with their factories.

An engine of your own (rollout.backend: package.module:build) declares its abilities on its
factory, `build.abilities = EngineAbilities(...)` (tests/plugins/toy_engine.py); without that,
or registered under a short name at run time, it has the defaults: it reports no log-probs,
runs lock-step only, takes a LoRA adapter from memory, and spans one GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo.config.errors import ConfigError
from grpo.core.registry import load_object

if TYPE_CHECKING:
    from grpo.config.sampling import RolloutConfig


@dataclass(frozen=True)
class EngineAbilities:
    reports_logprobs: bool = False  # lock-step answers carry the log-prob each token had
    # Written to slots (grpo.rollout.slots) for rollout.mode: continuous: takes weights between
    # two decode steps.
    continuous: bool = False
    adapters_in_memory: bool = True  # loads a LoRA adapter's tensors (streamed, broadcast)
    tensor_parallel: bool = False  # one engine spans rollout.vllm.tensor_parallel_size GPUs

    def gpus(self, rollout: RolloutConfig) -> int:
        """GPUs one engine of this kind spans."""
        return rollout.vllm.tensor_parallel_size if self.tensor_parallel else 1


BUILT_IN = {
    "hf": EngineAbilities(continuous=True),
    # vLLM loads adapters from a dir only; its answers carry their log-probs.
    "vllm": EngineAbilities(
        reports_logprobs=True, continuous=True, adapters_in_memory=False, tensor_parallel=True
    ),
}


def abilities(backend: str) -> EngineAbilities:
    """rollout.backend's abilities: a built-in engine's as declared here, an engine of your
    own's as its factory declares them (see the module)."""
    if backend in BUILT_IN:
        return BUILT_IN[backend]
    if ":" not in backend:
        return EngineAbilities()  # a short name registered at run time (or a bad name)
    try:
        declared = getattr(load_object(backend, "rollout engine"), "abilities", EngineAbilities())
    except ValueError as e:
        raise ConfigError(f"rollout.backend: {e}") from None
    if not isinstance(declared, EngineAbilities):
        raise ConfigError(
            f"rollout.backend: {backend}'s abilities must be an EngineAbilities, "
            f"not {type(declared).__name__}"
        )
    return declared
