"""What the config's checks know of each rollout engine: its abilities, declared once per
built-in engine, and asked by the checks and the placement instead of the engine's name. An
engine of your own (rollout.backend: package.module:build) has the defaults: it reports no
log-probs, runs lock-step only, takes a LoRA adapter from memory, and spans one GPU.
grpo.rollout.registry registers the same names with their factories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo.config.sampling import RolloutConfig


@dataclass(frozen=True)
class EngineAbilities:
    reports_logprobs: bool = False  # lock-step answers carry the log-prob each token had
    continuous: bool = False  # has a slot engine for rollout.mode: continuous
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
    """rollout.backend's abilities (the defaults for an engine of your own)."""
    return BUILT_IN.get(backend, EngineAbilities())
