"""Runs inside vLLM's worker processes (named by `worker_extension_cls`): the weight-transfer
engine that loads each version in place (grpo/rollout/vllm_transfer.py says why it is ours).

Only vLLM's worker imports this module, so it may import vLLM at the top; the sampler's side
of the transfer lives in grpo/rollout/vllm_transfer.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import (
    finalize_layerwise_reload,
    initialize_layerwise_reload,
)

from grpo.rollout.vllm_transfer import BACKEND
from grpo.runtime.lifetime import die_with_ancestor

# vLLM imports this module in its worker process (a child of the engine process the sampler
# started, or that process itself): neither may outlive the sampler (grpo/runtime/lifetime.py; the
# sampler names itself before the start).
die_with_ancestor()


@dataclass
class FilesInitInfo:
    """Nothing to rendezvous: each update names its files."""


@dataclass
class FilesUpdateInfo:
    files: list[str]
    version: int

    def __post_init__(self) -> None:
        if not self.files or not all(isinstance(f, str) for f in self.files):
            raise ValueError(f"update_weights needs a list of file paths, got {self.files!r}")
        if not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"update_weights needs a version number, got {self.version!r}")


class SafetensorsFilesEngine(WeightTransferEngine[FilesInitInfo, FilesUpdateInfo]):
    """Loads the safetensors files an update names into the worker's model, in place, inside
    vLLM's layerwise reload. `loaded` says which version the last finished update brought and
    how many tensors."""

    init_info_cls = FilesInitInfo
    update_info_cls = FilesUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: dict[str, int] = {"version": -1, "tensors": 0}
        self._received: dict[str, int] | None = None

    def init_transfer_engine(self, init_info: FilesInitInfo) -> None:
        pass  # nothing to join: the files are on this node

    def start_weight_update(self) -> None:
        self._received = None

    def receive_weights(self, update_info: FilesUpdateInfo) -> None:
        # The layerwise reload moves the model's layers to the meta device until each is loaded
        # whole, so it begins only once every file has been checked: a bad file leaves the
        # model serving what it served.
        handles = open_checked(update_info.files)
        initialize_layerwise_reload(self.model)
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in tensors_of(handles):
                count += 1
                yield item

        self.model.load_weights(counted())
        self._received = {"version": update_info.version, "tensors": count}

    def finish_weight_update(self) -> None:
        if self._received is None:
            return  # nothing was received: the model was not touched
        finalize_layerwise_reload(self.model, self.model_config)
        retie_lm_head(self.model, self.model_config.hf_config)
        self.loaded, self._received = self._received, None

    def shutdown(self) -> None:
        pass


def open_checked(files: list[str]) -> list[Any]:
    """Every file opened and its header validated by safetensors (offsets inside the file, sizes
    matching shapes and dtypes) before any tensor is read; no name twice."""
    from safetensors import safe_open

    handles: list[Any] = []
    seen: set[str] = set()
    for path in files:
        handle = safe_open(path, framework="pt")
        names = set(handle.keys())
        if names & seen:
            again = sorted(names & seen)[:3]
            raise ValueError(f"{path} repeats tensors of an earlier file: {again}")
        seen |= names
        handles.append(handle)
    return handles


def tensors_of(handles: list[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for handle in handles:  # mapped, so a tensor is read when the model's loader copies it
        for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
            yield name, handle.get_tensor(name)


def retie_lm_head(model: torch.nn.Module, hf_config: Any) -> None:
    """With tied embeddings the LM head shares the embedding's weight, but a reload gives the
    embedding a new tensor and leaves the head on the old one (and, on CPU, on a GEMM layout
    packed from it): point the head at the new weight and re-pack. Found by tests/test_vllm.py:
    without this the logits keep the old embedding."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(hf_config, "tie_word_embeddings", False) or head is None or embed is None:
        return
    head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)


class WeightReloader:
    """Mixed into vLLM's worker class; its methods are called by `LLM.collective_rpc`."""

    def grpo_loaded(self) -> dict[str, int]:
        """Which version the transfer engine last loaded, and how many tensors: for the sampler
        to check (vLLM's update calls return nothing)."""
        engine = self.weight_transfer_engine  # type: ignore[attr-defined]
        if not isinstance(engine, SafetensorsFilesEngine):
            raise RuntimeError(f"the worker's weight-transfer engine is {type(engine).__name__}")
        return dict(engine.loaded)


# Before the worker loads its model: that is when it creates its weight-transfer engine.
with contextlib.suppress(ValueError):  # registered already: imported before in this process
    WeightTransferEngineFactory.register_engine(BACKEND, SafetensorsFilesEngine)
