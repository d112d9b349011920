"""`python -m grpo merge-lora ADAPTER_DIR OUT_DIR [--base MODEL]`: a LoRA run's adapter folded
into its base model, written as a plain HF model dir (loadable with `from_pretrained`, servable
by vLLM, evaluable with `python -m grpo eval OUT_DIR`).

The base is the run's `model.path` when ADAPTER_DIR is one of a run's versions
(`<run>/versions/vNNNNNN` or `<run>/final`), else the adapter's own `base_model_name_or_path`;
`--base` overrides both. The output appears whole or not at all (written beside, then renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from grpo.config import ConfigError, load_config
from grpo.core.durable import as_umask_allows
from grpo.models.embedded import ModelError


def base_of(adapter: Path) -> str:
    """The model the adapter was trained on (see the module docstring)."""
    versions = adapter.resolve().parent  # <run>/versions/vNNNNNN (final links to one)
    run = versions.parent
    if versions.name == "versions" and (run / "config.yaml").is_file():
        return load_config(run / "config.yaml").model.path
    try:
        return json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError):
        raise ModelError(
            f"{adapter}: cannot tell its base model (not a run's version, and its "
            "adapter_config.json names none): give it with --base"
        ) from None


def merge_lora(adapter: Path, out: Path, base: str = "") -> Path:
    """Fold `adapter` into its base (float32, as the trainer keeps it) and write `out`."""
    from peft import PeftModel

    from grpo.models.loading import load_causal_lm, load_tokenizer, resolve_model_path

    if not (adapter / "adapter_config.json").is_file():
        raise ModelError(f"{adapter} is not a LoRA adapter dir (no adapter_config.json)")
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not empty: choose a new directory")
    base_dir = resolve_model_path(base or base_of(adapter), "--base")
    merged = PeftModel.from_pretrained(load_causal_lm(base_dir), adapter).merge_and_unload()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        merged.save_pretrained(tmp)
        load_tokenizer(base_dir).save_pretrained(tmp)
        as_umask_allows(tmp)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    what = __doc__.split("\n\n")[0]  # the whole first paragraph, not its first line
    p = argparse.ArgumentParser(prog="python -m grpo merge-lora", description=what)
    p.add_argument("adapter", type=Path, help="a LoRA version dir (e.g. RUN/final)")
    p.add_argument("out", type=Path, help="where the merged model goes (a new directory)")
    p.add_argument("--base", default="", help="the base model (default: the run's model.path)")
    args = p.parse_args(argv)
    try:
        written = merge_lora(args.adapter, args.out, args.base)
    except (ModelError, ConfigError, OSError) as e:
        print(f"merge-lora: {e}", file=sys.stderr)
        return 2
    print(f"merged model: {written}")
    return 0
