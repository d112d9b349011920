"""One received version as every engine loads it, whichever way it travelled: through one call
(RolloutEngine.load, and the sampler's HF policy), all or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.weights.dirs import is_adapter, load_state_dict
from grpo.weights.stream.image import Image
from grpo.weights.stream.torch_bits import state_from_image


@dataclass
class Version:
    """Version `number`: its tensors by published name (full weights, or a LoRA adapter's),
    read from a version dir on first use when one holds them (weights.mode shared_dir, files),
    else already in memory (stream, collective: `image`, which the HF policy loads bucket by
    bucket through a grpo.weights.stream.torch_bits.LoadPlan). An engine that reads files
    itself (vLLM) takes `vdir` where there is one and never has the tensors read for it."""

    number: int
    adapter: bool
    vdir: Path | None = None
    state: dict[str, torch.Tensor] | None = None
    image: Image | None = None

    @classmethod
    def from_dir(cls, vdir: Path, number: int) -> Version:
        return cls(number, is_adapter(vdir), vdir=vdir)

    @classmethod
    def from_image(cls, image: Image) -> Version:
        return cls(image.version, image.manifest.adapter, image=image)

    def tensors(self) -> dict[str, torch.Tensor]:
        if self.state is None and self.image is not None:
            self.state = state_from_image(self.image)
        if self.state is None:
            assert self.vdir is not None, "a version with neither tensors nor a dir"
            self.state = load_state_dict(self.vdir)
        return self.state

    def __str__(self) -> str:
        return str(self.vdir) if self.vdir is not None else f"version {self.number}"
