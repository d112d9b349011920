"""The value model of PPO: the policy's architecture with a scalar head, as a DeepSpeed engine.

V(s_t) for completion token t is read at the position that predicts token t (the same
alignment as the policy's logits), so values line up with the response mask.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo.algos import value_loss
from grpo.batching import pad_pairs, pad_right
from grpo.config import Config
from grpo.distributed import sum_across_ranks
from grpo.episode import Episode
from grpo.models import resolve_model_path, torch_dtype


def completion_values(model, input_ids, attention_mask, prompt_len: int) -> torch.Tensor:
    """(B, L) token ids -> (B, L - prompt_len) values of the completion positions."""
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        use_cache=False,
    )  # fmt: skip
    return out.logits[:, prompt_len - 1 : -1, 0].float()  # (B, C)


class Critic:
    def __init__(self, cfg: Config, ds_config: dict[str, Any]):
        import deepspeed
        from transformers import AutoModelForTokenClassification

        self.cfg = cfg
        path = resolve_model_path(cfg.critic.model_path or cfg.model.path)
        model = AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, dtype=torch_dtype(cfg.model.dtype)
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

    def _batch(self, eps, pad_id: int):
        pairs = pad_pairs([e.prompt_ids for e in eps], [e.completion_ids for e in eps], pad_id)
        device = self.engine.device
        return (pairs.input_ids.to(device), pairs.attention_mask.to(device), pairs.prompt_len,
                pairs.response_mask.to(device))  # fmt: skip

    @torch.no_grad()
    def values(self, eps: tuple[Episode, ...], pad_id: int) -> list[torch.Tensor]:
        """Values before any update, one (C_i,) per episode (micro-batched)."""
        out: list[torch.Tensor] = []
        micro = self.engine.train_micro_batch_size_per_gpu()
        for start in range(0, len(eps), micro):
            chunk = eps[start : start + micro]
            ids, attn, prompt_len, _ = self._batch(chunk, pad_id)
            values = completion_values(self.engine, ids, attn, prompt_len).cpu()
            out += [values[i, : len(e.completion_ids)] for i, e in enumerate(chunk)]
        return out

    def update(
        self,
        eps: tuple[Episode, ...],
        returns: list[torch.Tensor],
        old_values: list[torch.Tensor],
        pad_id: int,
    ) -> dict[str, float]:
        """One optimizer step of the clipped value loss over `eps` (micro-batched)."""
        micro = self.engine.train_micro_batch_size_per_gpu()
        n_micro = math.ceil(len(eps) / micro)
        n_tokens = max(1, sum(len(e.completion_ids) for e in eps))
        # a token mean over all ranks' tokens, as for the policy (DeepSpeed averages the ranks)
        world = dist.get_world_size()
        all_tokens = max(1.0, float(sum_across_ranks(torch.tensor([float(n_tokens)]))))
        sums: dict[str, float] = {}
        for start in range(0, len(eps), micro):
            chunk = eps[start : start + micro]
            ids, attn, prompt_len, mask = self._batch(chunk, pad_id)
            width = mask.shape[1]
            target = pad_right(returns[start : start + micro], width).to(mask.device)
            old = pad_right(old_values[start : start + micro], width).to(mask.device)
            values = completion_values(self.engine, ids, attn, prompt_len)
            loss, metrics = value_loss(
                values, target, old, mask, clip=self.cfg.critic.value_clip, agg="token-mean"
            )
            tokens = float(mask.sum())
            self.engine.backward(loss * tokens / all_tokens * world * n_micro)
            self.engine.step()
            metrics["vf_loss"] = float(loss)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * tokens / n_tokens
        return sums

    def save_state(self, state_dir: Path, tag: str) -> None:
        self.engine.save_checkpoint(str(state_dir), tag=tag)


def _with_lr(ds_config: dict[str, Any], lr: float) -> dict[str, Any]:
    optimizer = dict(ds_config.get("optimizer", {"type": "AdamW"}))
    optimizer["params"] = {**optimizer.get("params", {}), "lr": lr}
    return optimizer
