"""The value model of PPO: the policy's architecture with a scalar head, as a DeepSpeed engine.

V(s_t) for completion token t is read at the position that predicts token t (the same
alignment as the policy's logits, from the same forward: grpo.scoring.forward), so values line
up with the response mask. Its optimizer steps are the policy's (grpo.trainer.step), with
the value loss of :meth:`Critic.micro_batch_loss`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from grpo.algos import value_loss
from grpo.config import Config
from grpo.models.loading import resolve_model_path, torch_dtype
from grpo.scoring.forward import completion_outputs
from grpo.trainer.engines import partitioned_loading
from grpo.trainer.experience import Experience


def completion_values(
    model, prompts: list[np.ndarray], completions: list[np.ndarray], packed: bool, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) values of the completion positions and the (B, C) response mask, on the model's
    device: the one-label head's output where the policy has its logits."""
    out = completion_outputs(
        model, prompts, completions, packed=packed, pad_id=pad_id, skip_prompt_logits=False
    )
    values = out.to_rows(out.logits[..., 0].float())
    return values, out.mask.to(values.device)


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
        return completion_values(
            self.engine, part.prompts, part.completions, self.cfg.packed, pad_id
        )

    @torch.no_grad()
    def values(self, exp: Experience, width: int, pad_id: int) -> torch.Tensor:
        """(N, width) values before any update (width at least the longest answer's), on the
        CPU like the experience (micro-batched)."""
        out = torch.zeros(len(exp), width)
        micro = self.engine.train_micro_batch_size_per_gpu()
        for start in range(0, len(exp), micro):
            part = exp.rows(slice(start, start + micro))
            values = self._values(part, pad_id)[0].float().cpu()
            out[start : start + len(part), : values.shape[1]] = values * part.mask
        return out

    def micro_batch_loss(
        self, part: Experience, pad_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The clipped value loss of the micro-batch `part` towards `part.returns`, centred on
        `part.old_values`, as a token mean; its (B, C) mask and its metrics (0-d tensors), on
        the critic's device, as grpo.trainer.step.micro_batch_loss gives the policy's."""
        assert part.returns is not None and part.old_values is not None
        values, _ = self._values(part, pad_id)
        # the experience's mask, not the forward's: no value loss on a tool's tokens
        mask = part.mask.to(values.device)
        target, old = (t.to(mask.device) for t in (part.returns, part.old_values))
        loss, metrics = value_loss(
            values, target, old, mask, clip=self.cfg.critic.value_clip, agg="token-mean"
        )
        return loss, mask, metrics | {"vf_loss": loss.detach()}


def _with_lr(ds_config: dict[str, Any], lr: float) -> dict[str, Any]:
    optimizer = dict(ds_config.get("optimizer", {"type": "AdamW"}))
    optimizer["params"] = {**optimizer.get("params", {}), "lr": lr}
    return optimizer
