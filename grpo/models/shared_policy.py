"""The sampler's HF policy: loaded on first use, to score answers (train.logprobs_on: sampler)
or for an engine that samples with it, and kept at the sampler's version by
grpo.weights.in_use (vLLM with trainer-side scoring needs none). The evaluation CLI uses it
too."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from grpo.config import Config
from grpo.models.loading import adapter_state, apply_lora, load_causal_lm, pack_adapter
from grpo.runtime.placement import sampler_memory_fraction

log = logging.getLogger("grpo.sampler")


def hf_device(cfg: Config) -> str:
    """Where the sampler's HF models go; on a GPU shared with the trainer, their memory is
    capped."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and (cap := sampler_memory_fraction(cfg)):
        # Sharing the GPU with the trainer: past the cap our allocations fail here,
        # with a message, instead of the trainer running out of memory mid-step.
        torch.cuda.set_per_process_memory_fraction(cap)
        log.info("sampler: HF models capped at %.0f%% of the GPU's memory", 100 * cap)
    return device


class SharedPolicy:
    """The HF policy (with its LoRA adapter when model.lora is on), on `device`."""

    def __init__(self, cfg: Config, model_path: Path):
        self.cfg = cfg
        self.model_path = model_path
        self.device = hf_device(cfg)
        self._module: torch.nn.Module | None = None
        self._tensors: dict[str, torch.Tensor] | None = None

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def module(self) -> torch.nn.Module:
        """The policy, loaded on first use."""
        if self._module is None:
            cfg = self.cfg
            attn = cfg.model.attn_implementation
            policy = load_causal_lm(self.model_path, cfg.model.dtype, attn).eval()
            if cfg.model.lora.enabled:
                policy = apply_lora(policy, cfg.model.lora).eval()
            self._module = policy.to(self.device)
            if cfg.model.lora.enabled:
                pack_adapter(self._module)  # each version of it loaded with one copy
        return self._module

    def tensors(self, adapter: bool) -> dict[str, torch.Tensor]:
        """The policy's tensors (the adapter's alone with LoRA) by their published names,
        sharing its memory: found once, loaded into at every version."""
        if self._tensors is None:
            policy = self.module()
            self._tensors = adapter_state(policy) if adapter else policy.state_dict()
        return self._tensors

    def tied(self, adapter: bool) -> set[str]:
        """The policy's tensors a version may leave out: those sharing another's memory."""
        if adapter:
            return set()
        tied = getattr(self.module(), "_tied_weights_keys", None) or []
        return set(tied) | {"lm_head.weight"}
