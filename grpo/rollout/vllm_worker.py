"""Runs inside vLLM's worker processes (named by `worker_extension_cls`): in-place weight
reload. Kept free of vLLM imports so that the name resolves in any worker."""

from __future__ import annotations

from pathlib import Path

from grpo.runtime.lifetime import die_with_ancestor

# vLLM imports this module in its worker process (a child of the engine process the sampler
# started, or that process itself): neither may outlive the sampler (grpo/runtime/lifetime.py; the
# sampler names itself before the start).
die_with_ancestor()


class WeightReloader:
    """Mixed into vLLM's worker class; its methods are called by `LLM.collective_rpc`."""

    def grpo_reload(self, weights_files: list[str], version: int) -> dict[str, int]:
        """Load a full safetensors checkpoint (one file or its shards) into the running model,
        in place.

        Reading happens here, in the worker, so the tensors never cross the RPC pipe.
        vLLM's reload_weights re-runs the loaders and their post-processing (fused QKV,
        CPU weight repacking), which a bare `model.load_weights` after start-up cannot.
        Returns what was loaded, for the caller to check.
        """
        from safetensors.torch import safe_open

        count = [0]

        def tensors():  # one shard open at a time
            for path in weights_files:
                with safe_open(Path(path), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                        count[0] += 1
                        yield name, f.get_tensor(name)

        self.model_runner.reload_weights(weights_iterator=tensors())  # type: ignore[attr-defined]
        self._retie_lm_head()
        return {"version": version, "tensors": count[0]}

    def grpo_load_tensors(self, payload: bytes, version: int) -> dict[str, int]:
        """Streamed tensors (safetensors bytes) into the running model, in place, as
        grpo_reload loads a checkpoint's."""
        from safetensors.torch import load

        named = list(load(payload).items())
        self.model_runner.reload_weights(weights_iterator=iter(named))  # type: ignore[attr-defined]
        self._retie_lm_head()
        return {"version": version, "tensors": len(named)}

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
