"""A randomly initialised Llama-shaped model for tests and quick benchmarks (no download)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from grpo.models.loading import load_tokenizer


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
