"""The value model of PPO: the policy's architecture with a scalar head, as a DeepSpeed engine.

V(s_t) for completion token t is read at the position that predicts token t (the same
alignment as the policy's logits), so values line up with the response mask.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from grpo.algos import value_loss
from grpo.config import Config
from grpo.core.batching import pack_pairs, pad_pairs
from grpo.models.loading import resolve_model_path, torch_dtype
from grpo.scoring.forward import device_of
from grpo.trainer.engines import partitioned_loading
from grpo.trainer.experience import Experience
from grpo.trainer.ranks import accumulate_backward, micro_batches, sum_across_ranks


def completion_values(
    model, prompts: list[np.ndarray], completions: list[np.ndarray], packed: bool, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) values of the completion positions and the (B, C) response mask."""
    device = device_of(model)
    if packed:
        pairs = pack_pairs(prompts, completions)
        out = model(
            input_ids=pairs.input_ids.to(device),
            position_ids=pairs.position_ids.to(device),
            use_cache=False,
        )
        flat = out.logits[:, pairs.logit_index.to(device), 0].float()  # (1, K)
        return pairs.unpack(flat), pairs.response_mask.to(device)
    padded = pad_pairs(prompts, completions, pad_id)
    attention_mask = padded.attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)
    out = model(
        input_ids=padded.input_ids.to(device), attention_mask=attention_mask,
        position_ids=position_ids, use_cache=False,
    )  # fmt: skip
    values = out.logits[:, padded.prompt_len - 1 : -1, 0].float()  # (B, C)
    return values, padded.response_mask.to(device)


class Critic:
    def __init__(self, cfg: Config, ds_config: dict[str, Any]):
        import deepspeed
        from transformers import AutoModelForTokenClassification

        self.cfg = cfg
        path = resolve_model_path(cfg.critic.model_path or cfg.model.path)
        with partitioned_loading(ds_config):  # ZeRO-3: built partitioned, as the policy
            model = AutoModelForTokenClassification.from_pretrained(
                path,
                num_labels=1,
                dtype=torch_dtype(cfg.model.dtype),
                attn_implementation=cfg.model.attn_implementation,
            )
        # The head's default dropout (0.1 for Llama-like configs) would make the values before
        # the update, the GAE baseline and the centre of the value clip, noisy.
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        ds_config = {**ds_config, "optimizer": _with_lr(ds_config, cfg.critic.lr)}
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config
        )
        self.engine.train()

    def _values(self, part: Experience, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return completion_values(self.engine, part.prompts, part.completions, self.cfg.packed,
                                 pad_id)  # fmt: skip

    @torch.no_grad()
    def values(self, exp: Experience, pad_id: int) -> torch.Tensor:
        """(N, C) values before any update, on the CPU like the experience (micro-batched)."""
        out = torch.zeros_like(exp.mask)
        micro = self.engine.train_micro_batch_size_per_gpu()
        for start in range(0, len(exp), micro):
            part = exp.rows(slice(start, start + micro))
            values = self._values(part, pad_id)[0].float().cpu()
            out[start : start + len(part), : values.shape[1]] = values * part.mask
        return out

    def update(self, mini: Experience, pad_id: int) -> dict[str, float]:
        """One optimizer step of the clipped value loss towards `mini.returns`, centred on
        `mini.old_values` (micro-batched)."""
        assert mini.returns is not None and mini.old_values is not None
        parts = micro_batches(mini.sizes, self.cfg, self.engine.train_micro_batch_size_per_gpu())
        n_tokens = max(1, int(mini.mask.sum()))
        # a token mean over all ranks' tokens, as for the policy (DeepSpeed averages the ranks)
        world = dist.get_world_size()
        all_tokens = max(1.0, float(sum_across_ranks(torch.tensor([float(n_tokens)]))))
        sums: dict[str, torch.Tensor] = {}
        for i, index in enumerate(parts):
            part = mini.rows(index)
            values, _ = self._values(part, pad_id)
            # the experience's mask, not the forward's: no value loss on a tool's tokens
            mask = part.mask.to(values.device)
            target, old = (t.to(mask.device) for t in (part.returns, part.old_values))
            loss, metrics = value_loss(
                values, target, old, mask, clip=self.cfg.critic.value_clip, agg="token-mean"
            )
            tokens = float(mask.sum())
            accumulate_backward(
                self.engine, loss * tokens / all_tokens * world, last=i == len(parts) - 1
            )
            metrics["vf_loss"] = loss.detach()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * tokens / n_tokens
        return {key: float(value) for key, value in sums.items()}  # one transfer per update


def _with_lr(ds_config: dict[str, Any], lr: float) -> dict[str, Any]:
    optimizer = dict(ds_config.get("optimizer", {"type": "AdamW"}))
    optimizer["params"] = {**optimizer.get("params", {}), "lr": lr}
    return optimizer
