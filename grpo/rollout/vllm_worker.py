"""Runs inside vLLM's worker processes (named by `worker_extension_cls`): in-place weight
reload. Kept free of vLLM imports so that the name resolves in any worker."""

from __future__ import annotations

from pathlib import Path


class WeightReloader:
    """Mixed into vLLM's worker class; its methods are called by `LLM.collective_rpc`."""

    def grpo_reload(self, weights_file: str, version: int) -> dict[str, int]:
        """Load a full safetensors checkpoint into the running model, in place.

        Reading happens here, in the worker, so the tensors never cross the RPC pipe.
        vLLM's reload_weights re-runs the loaders and their post-processing (fused QKV,
        CPU weight repacking), which a bare `model.load_weights` after start-up cannot.
        Returns what was loaded, for the caller to check.
        """
        from safetensors.torch import safe_open

        path = Path(weights_file)
        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            tensors = ((name, f.get_tensor(name)) for name in names)
            self.model_runner.reload_weights(weights_iterator=tensors)  # type: ignore[attr-defined]
        self._retie_lm_head()
        return {"version": version, "tensors": len(names)}

    def _retie_lm_head(self) -> None:
        """With tied embeddings the LM head shares the embedding's weight, but the reload
        gives the embedding a new tensor and leaves the head on the old one (and, on CPU,
        on a GEMM layout packed from it): point the head at the new weight and re-pack.
        Found by tests/test_vllm.py: without this the logits keep the old embedding."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        config = self.model_runner.model_config.hf_config  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
            return
        head.weight = embed.weight
        head.quant_method.process_weights_after_loading(head)
