"""A version in memory (weights.mode stream, collective) into the sampler's HF policy: through a
LoadPlan made once per model, one copy per bucket, all or nothing."""

from __future__ import annotations

import pytest
import torch

from grpo.config import load_config
from grpo.models.loading import adapter_state, apply_lora, load_causal_lm, pack_adapter
from grpo.models.shared_policy import SharedPolicy
from grpo.weights.in_use import PolicyCopy
from grpo.weights.stream.image import Image
from grpo.weights.stream.torch_bits import LoadPlan, image_from_state
from grpo.weights.version import Version

BUCKET_BYTES = 40_000  # a few buckets of the tiny model's adapter


def _lora_cfg(tmp_path, model_dir, *more: str):
    return load_config(None, [f"output_dir={tmp_path}", f"model.path={model_dir}",
                              "model.lora.enabled=true", *more])  # fmt: skip


def _trained(model_dir, cfg, seed: int) -> torch.nn.Module:
    """The trainer's model after some steps: every adapter tensor moved."""
    model = apply_lora(load_causal_lm(model_dir), cfg.model.lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in adapter_state(model).values():
            t.add_(torch.randn(t.shape, generator=gen) * 0.1)
    return model.eval()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(3, 12).unsqueeze(0)).logits


def test_a_streamed_adapter_goes_into_the_sampler_s_packed_policy_one_copy_a_bucket(
    tmp_path, tiny_model_dir
) -> None:
    """The sampler's policy holds its adapter in one buffer (pack_adapter), back to back in the
    order a version lists it: each bucket of a version is one copy into it, and the policy then
    samples as the trainer's model does. The plan is made once for the versions of the model."""
    cfg = _lora_cfg(tmp_path, tiny_model_dir)
    shared = SharedPolicy(cfg, tiny_model_dir)
    policy, copy = shared.module(), PolicyCopy(shared)
    storages = {p.untyped_storage().data_ptr() for n, p in policy.named_parameters()
                if "lora_" in n}  # fmt: skip
    assert len(storages) == 1, "the adapter is not in one buffer"
    plans = []
    for version, seed in ((1, 1), (2, 2)):
        trainer = _trained(tiny_model_dir, cfg, seed)
        image = image_from_state(version, adapter_state(trainer), BUCKET_BYTES, True)
        assert len(image.manifest.buckets) > 1
        copy.load(Version.from_image(image))
        plans.append(copy._plan)
        assert all(span is not None for span, _, _ in copy._plan.buckets)
        assert torch.equal(_logits(policy), _logits(trainer))
        ours, theirs = adapter_state(policy), adapter_state(trainer)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert plans[0] is plans[1]


def test_full_weights_go_into_the_policy_whatever_its_dtype_and_layout(
    tmp_path, tiny_model_dir
) -> None:
    """A version of the full weights (its tied head left out) into targets held in another
    dtype, transposed (not contiguous) or scattered: the same values, each bucket one
    multi-tensor copy."""
    trainer = load_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01)
    image = image_from_state(3, trainer.state_dict(), BUCKET_BYTES, False)
    theirs = trainer.state_dict()
    names = [s.name for s in image.manifest.specs]
    targets = {n: torch.zeros(theirs[n].shape, dtype=torch.bfloat16) for n in names}
    square = next(n for n in names if theirs[n].dim() == 2 and len(set(theirs[n].shape)) == 1)
    targets[square] = torch.zeros(theirs[square].shape).t()  # a transposed view
    assert not targets[square].is_contiguous()
    LoadPlan(targets, image.manifest, {"lm_head.weight"}, "version 3").load(image)
    for n in names:
        assert torch.equal(targets[n], theirs[n].to(targets[n].dtype)), n


def test_a_version_of_another_model_is_refused_before_anything_is_copied(
    tmp_path, tiny_model_dir
) -> None:
    """An adapter of another rank (other shapes), or with a tensor missing: refused when the
    plan is made, the policy's tensors as they were."""
    cfg = _lora_cfg(tmp_path, tiny_model_dir)
    shared = SharedPolicy(cfg, tiny_model_dir)
    copy = PolicyCopy(shared)
    before = {k: t.clone() for k, t in adapter_state(shared.module()).items()}
    other_rank = _trained(tiny_model_dir, _lora_cfg(tmp_path, tiny_model_dir, "model.lora.r=4"), 1)
    other = image_from_state(1, adapter_state(other_rank), BUCKET_BYTES, True)
    with pytest.raises(RuntimeError, match="version 1 does not match the policy: .*other shapes"):
        copy.load(Version.from_image(other))
    real = image_from_state(2, adapter_state(_trained(tiny_model_dir, cfg, 2)), 1 << 30, True)
    specs = real.manifest.specs
    short = Image.of_buckets(2, specs[:-1], ((0, len(specs) - 1),),
                             {0: real.flats[0][: -specs[-1].nbytes]}, True)  # fmt: skip
    with pytest.raises(RuntimeError, match="version 2 does not match the policy: missing"):
        copy.load(Version.from_image(short))
    after = adapter_state(shared.module())
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_pack_adapter_keeps_the_model_as_it_was(tiny_model_dir) -> None:
    """Packing moves the adapter's tensors, not their values: the model's outputs are the
    same, and every adapter tensor is a view of one buffer."""
    cfg = load_config(None, ["model.lora.enabled=true"])
    model = _trained(tiny_model_dir, cfg, 5)
    before = _logits(model)
    pack_adapter(model)
    assert torch.equal(_logits(model), before)
    state = adapter_state(model)
    flat = next(iter(state.values())).untyped_storage()
    assert all(t.untyped_storage().data_ptr() == flat.data_ptr() for t in state.values())


def _flat_groups(params: list[torch.nn.Parameter], gap_at: int, pad: int) -> None:
    """The parameters moved into one buffer as a DeepSpeed ZeRO-1/2 rank holds them: back to
    back in their order, each a view of it, two groups with `pad` elements of padding between
    them (before parameter `gap_at`)."""
    buffer = torch.zeros(sum(p.numel() for p in params) + pad)
    at = 0
    with torch.no_grad():
        for i, p in enumerate(params):
            at += pad if i == gap_at else 0
            view = buffer[at : at + p.numel()].view(p.shape)
            view.copy_(p.data)
            p.data, at = view, at + p.numel()


def test_a_flat_parameter_group_is_copied_whole_never_across_padding(
    tiny_model_dir, monkeypatch
) -> None:
    """Where a bucket's tensors sit back to back in one buffer (the trainer's parameters under
    DeepSpeed ZeRO-1/2) the image copies the bucket with one call; a bucket across the padding
    between two groups is joined tensor by tensor. The image is the same either way."""
    model = _trained(tiny_model_dir, load_config(None, ["model.lora.enabled=true"]), 3)
    scattered = {k: t.clone() for k, t in adapter_state(model).items()}
    expected = image_from_state(1, scattered, BUCKET_BYTES, True)
    start, end = next(b for b in expected.manifest.buckets if b[1] - b[0] >= 2)
    joins: list[int] = []
    flatten = torch._utils._flatten_dense_tensors
    monkeypatch.setattr(torch._utils, "_flatten_dense_tensors",
                        lambda ts: joins.append(len(ts)) or flatten(ts))  # fmt: skip
    image_from_state(1, scattered, BUCKET_BYTES, True)
    assert len(joins) == sum(b - a > 1 for a, b in expected.manifest.buckets) > 1
    joins.clear()
    _flat_groups([p for p in model.parameters() if p.requires_grad], start + 1, pad=16)
    image = image_from_state(1, adapter_state(model), BUCKET_BYTES, True)
    assert joins == [end - start]  # the bucket across the padding, and no other
    assert image.manifest.identity == expected.manifest.identity  # every bucket's checksum
