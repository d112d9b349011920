"""Loading the policy, the reference and the tokenizer ('embedded' names the built-in model,
converted once by grpo.models.convert)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from grpo.config import LoraConfig
from grpo.models.convert import ensure_embedded_base
from grpo.models.embedded import EMBEDDED, ModelError


def resolve_model_path(path: str) -> Path:
    """'embedded' -> the converted base dir; anything else must be an existing HF model dir."""
    if path == EMBEDDED:
        return ensure_embedded_base()
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelError(
            f"model.path {path!r} is not an HF model dir (no config.json there); "
            "use 'embedded' for the built-in SmolLM2-135M-Instruct"
        )
    return p


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # generation appends after the prompt
    return tok


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_causal_lm(
    path: Path, dtype: str = "float32", attn_implementation: str = "sdpa"
) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(dtype), attn_implementation=attn_implementation
    )


def load_reference(
    path: Path, dtype: str = "float32", attn_implementation: str = "sdpa"
) -> torch.nn.Module:
    """The frozen initial model the KL penalty pulls towards."""
    model = load_causal_lm(path, dtype, attn_implementation).eval()
    model.requires_grad_(False)
    return model


def apply_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def params_partitioned(module: torch.nn.Module) -> bool:
    """Whether `module`'s parameters are ZeRO-3 partitions (DeepSpeed gives those a ds_id)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())
