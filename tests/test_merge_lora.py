"""`python -m grpo merge-lora`: a LoRA run's version folded into its base model gives the same
logits as the adapter on its base, as a plain model dir that `grpo eval` takes."""

from __future__ import annotations

import contextlib
import io
import os

import pytest
import torch
import yaml

from grpo.config import load_config
from grpo.models.loading import apply_lora, load_causal_lm
from grpo.models.merge import main


@pytest.fixture
def lora_run(tiny_model_dir, tmp_path):
    """A run dir whose version 2 is a LoRA adapter with weights that change the output."""
    cfg = load_config(None, ["model.lora.enabled=true", "model.lora.r=8"])
    peft_model = apply_lora(load_causal_lm(tiny_model_dir), cfg.model.lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    run = tmp_path / "run"
    peft_model.save_pretrained(run / "versions" / "v000002")
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"path": str(tiny_model_dir)}}))
    (run / "final").symlink_to("versions/v000002")
    return run, peft_model.eval()


def test_the_merged_model_answers_as_the_adapter_on_its_base(lora_run, tmp_path, tiny_model_dir):
    run, peft_model = lora_run
    out = tmp_path / "merged"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([str(run / "final"), str(out)]) == 0
    merged = load_causal_lm(out).eval()
    assert not any("lora" in name for name in merged.state_dict())
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    with torch.no_grad():
        want, got = peft_model(ids).logits, merged(ids).logits
        base = load_causal_lm(tiny_model_dir)(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(base, want, atol=1e-3)  # the adapter changes the output
    assert (out / "tokenizer_config.json").is_file()
    # issue 64, item 6: readable as the user's umask says (transformers writes the weights 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~mask for p in out.iterdir()
    }


def test_a_bad_merge_is_one_line_and_writes_nothing(lora_run, tmp_path, tiny_model_dir):
    run, _ = lora_run
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    for argv, says in (
        ([str(run / "final"), str(taken)], "exists and is not empty"),
        ([str(tiny_model_dir), str(tmp_path / "o")], "is not a LoRA adapter dir"),
    ):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(argv) == 2
        assert err.getvalue().count("\n") == 1 and says in err.getvalue(), err.getvalue()
    assert not (tmp_path / "o").exists() and (taken / "x").read_text() == "mine"


def test_any_model_dir_is_evaluated_and_left_as_it_was(lora_run, tmp_path, capsys):
    """`python -m grpo eval` on a model outside a run (here the merged one): the defaults' task,
    a table printed, nothing written into the model's directory."""
    from grpo.eval_cli import main as eval_main

    run, _ = lora_run
    out = tmp_path / "merged"
    assert main([str(run / "final"), str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())
    assert eval_main([str(out), "--num-questions", "2", "--max-new-tokens", "4"]) == 0
    printed = capsys.readouterr().out
    assert f"gsm8k: {out}" in printed and "| 0 | " in printed and "| 2 |" in printed
    assert sorted(p.name for p in out.iterdir()) == before
    assert eval_main([str(out), "--versions", "3"]) == 2  # a model has no versions to pick


def test_the_base_is_the_flag_s_then_the_run_s_then_the_adapter_s(tmp_path, monkeypatch):
    """Issue 63, second sources: the run's config and the adapter name different bases here
    (the other tests' fixtures name one), and `final` is a link into versions/."""
    import json

    import grpo.models.loading as loading
    from grpo.models.embedded import ModelError
    from grpo.models.merge import base_of, merge_lora

    run = tmp_path / "run"
    version = run / "versions" / "v000002"
    version.mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  path: the-run/base\n")
    (version / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "the-adapter/base"})
    )
    (run / "final").symlink_to(version, target_is_directory=True)
    assert base_of(run / "final") == base_of(version) == "the-run/base"
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "adapter_config.json").write_text(version.joinpath("adapter_config.json").read_text())
    assert base_of(loose) == "the-adapter/base"

    asked = []

    def resolve(path: str, key: str = "") -> None:
        asked.append(path)
        raise ModelError("stop here")

    monkeypatch.setattr(loading, "resolve_model_path", resolve)
    for base in ("the-flag/base", ""):
        with pytest.raises(ModelError, match="stop here"):
            merge_lora(run / "final", tmp_path / "out", base)
    assert asked == ["the-flag/base", "the-run/base"]
