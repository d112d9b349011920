"""Loading the policy, the reference and the tokenizer ('embedded' names the built-in model,
converted once by grpo.models.convert)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from grpo.config import LoraConfig
from grpo.models.convert import ensure_embedded_base
from grpo.models.embedded import EMBEDDED, ModelError, require_model_dir


def resolve_model_path(path: str, key: str = "model.path") -> Path:
    """'embedded' -> the converted base dir; anything else must be an existing HF model dir
    (ModelError naming the config `key` that gave `path` otherwise)."""
    if path == EMBEDDED:
        return ensure_embedded_base()
    try:
        return require_model_dir(path)
    except ModelError as e:
        raise ModelError(f"{key} {e}") from None


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


# model -> (its active adapter, the adapter's parameters by published name), found once
_ADAPTERS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, list]] = (
    weakref.WeakKeyDictionary()
)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A peft model's LoRA tensors under the names peft saves them with (what
    get_peft_model_state_dict gives for model.lora's settings), sharing the parameters' memory.
    The parameters are found once per model and adapter: walking a peft model's modules takes
    2 ms for SmolLM2-135M (35 through its whole state dict), a third of a LoRA sync's budget.
    Each is detached when asked for, so what a ZeRO-3 gather put in it is what is read."""
    active = model.active_adapter
    found = _ADAPTERS.get(model)
    if found is None or found[0] != active:
        prefix = f".{active}."
        params = [
            (name.replace(prefix, "."), p)
            for name, p in model.named_parameters()
            if "lora_" in name
        ]
        found = _ADAPTERS[model] = (active, params)
    return {name: p.detach() for name, p in found[1]}


def pack_adapter(model: torch.nn.Module) -> None:
    """Moves a peft model's LoRA parameters into one buffer, back to back in adapter_state's
    order (the order a version lists them in), each parameter a view of it: a version of the
    adapter is then loaded with one copy (grpo.weights.stream.torch_bits.LoadPlan), not 240
    small ones. For a model that is only sampled with (the sampler's policy): an optimizer
    holding the parameters would keep the old tensors. Nothing is moved when they differ in
    dtype or device."""
    adapter_state(model)  # finds the parameters
    pack_parameters([p for _, p in _ADAPTERS[model][1]])


def pack_parameters(params: list[torch.nn.Parameter]) -> None:
    """Moves `params` into one buffer, back to back in their order, each a view of it (as a
    DeepSpeed ZeRO-1/2 rank holds what it trains: its flat group). Nothing is moved when they
    differ in dtype or device."""
    if not params or len({(p.dtype, p.device) for p in params}) != 1:
        return
    with torch.no_grad():
        flat = torch._utils._flatten_dense_tensors([p.data for p in params])
        views = torch._utils._unflatten_dense_tensors(flat, [p.data for p in params])
        for p, view in zip(params, views, strict=True):
            p.data = view


def require_same_tensors(
    expected: Mapping[str, tuple[int, ...]],
    state: Mapping[str, torch.Tensor],
    tied: set[str],
    what: str,
) -> None:
    """RuntimeError unless `state` holds exactly the tensors `expected` names, each of its
    shape. `tied`: names that may be missing (they share another tensor's memory)."""
    require_same_shapes(expected, {n: tuple(t.shape) for n, t in state.items()}, tied, what)


def require_same_shapes(
    expected: Mapping[str, tuple[int, ...]],
    given: Mapping[str, tuple[int, ...]],
    tied: set[str],
    what: str,
) -> None:
    """require_same_tensors, of tensors known by their shapes (a version's manifest)."""
    missing = sorted(set(expected) - set(given) - tied)
    unexpected = sorted(set(given) - set(expected))
    shapes = sorted(n for n in set(given) & set(expected) if tuple(given[n]) != tuple(expected[n]))
    if missing or unexpected or shapes:
        raise RuntimeError(
            f"{what} does not match the policy: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}, other shapes {shapes[:3]} (the same model and model.lora on "
            "both roles?)"
        )


def copy_state(
    targets: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    tied: set[str],
    what: str,
) -> None:
    """Copy `state` into `targets` (views of a model's tensors: its state_dict, or
    adapter_state), in place, all or nothing: refused before anything is copied when it does
    not match them (require_same_tensors)."""
    require_same_tensors({n: tuple(t.shape) for n, t in targets.items()}, state, tied, what)
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)


def params_partitioned(module: torch.nn.Module) -> bool:
    """Whether `module`'s parameters are ZeRO-3 partitions (DeepSpeed gives those a ds_id)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())
