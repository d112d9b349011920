"""What `grpo check`, launch.sh and each role's start refuse before any model loads (issue 45.1),
in-process: the ports the trainer listens on, the CURVE keys each role loads, and what this node
can run (the attention kernel without a GPU, the trainer's ranks on its cores). The checks that
open files (model dir, dataset, reward, DeepSpeed config, saved state) run through launch.sh in
tests/test_integration.py and tests/test_launch_path.py."""

from __future__ import annotations

import socket

import pytest

import grpo.preflight as preflight_module
from grpo.config import ConfigError, load_config
from grpo.preflight import preflight
from grpo.wire.keys import generate
from tests.conftest import free_port


def config(model_dir, *overrides: str):
    return load_config(None, [f"model.path={model_dir}", *overrides])


@pytest.fixture
def held_port():
    """A port this process listens on, as a trainer left running would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_another_process_holds_is_named_with_the_process(tiny_model_dir, held_port,
                                                                monkeypatch):  # fmt: skip
    cfg = config(tiny_model_dir, f"transport.episodes_addr=tcp://127.0.0.1:{held_port}")
    for role in ("both", "trainer"):
        with pytest.raises(ConfigError) as e:
            preflight(cfg, role)
        said = str(e.value)
        assert said.startswith(f"transport.episodes_addr: cannot listen on tcp://127.0.0.1:"
                               f"{held_port}: Address already in use; held by pid ")  # fmt: skip
        assert "\n" not in said
    preflight(cfg, "sampler")  # a sampler connects there: nothing to probe
    # Only trainer rank 0 listens: the other ranks start while it holds the ports.
    monkeypatch.setenv("RANK", "1")
    preflight(cfg, "trainer")
    monkeypatch.delenv("RANK")
    second_node = ("train.nnodes=2", "train.node_rank=1")
    held = f"transport.episodes_addr=tcp://127.0.0.1:{held_port}"
    preflight(config(tiny_model_dir, *second_node, held), "trainer")
    preflight(config(tiny_model_dir), "both")  # the default ports are free here


def test_the_collective_rendezvous_port_is_probed_with_the_others(tiny_model_dir, held_port):
    """weights.mode collective listens on a fourth port, weights.collective_addr: one held is
    named before the run, as the other three are."""
    cfg = config(tiny_model_dir, "weights.mode=collective",
                 f"transport.weights_addr=tcp://127.0.0.1:{free_port()}",
                 f"weights.collective_addr=tcp://127.0.0.1:{held_port}")  # fmt: skip
    with pytest.raises(ConfigError, match=f"weights.collective_addr: cannot listen on "
                       f"tcp://127.0.0.1:{held_port}: Address already in use"):  # fmt: skip
        preflight(cfg, "trainer")


def test_resume_always_needs_a_complete_training_state(tiny_model_dir, tmp_path):
    """A state dir that a crash left half-written (no completion marker) is not resumed from."""
    from grpo.core.durable import TRAIN_STATE_MARKER, train_state_dir

    cfg = config(tiny_model_dir, f"output_dir={tmp_path}", "train.resume=always")
    state = train_state_dir(cfg.run_dir)
    state.mkdir(parents=True)
    (state / "rank0.pt").write_bytes(b"half")
    with pytest.raises(ConfigError, match="no complete training state in"):
        preflight(cfg, "trainer")
    (state / TRAIN_STATE_MARKER).write_text("")
    preflight(cfg, "trainer")


def test_listening_beyond_loopback_needs_keys_or_a_word(tiny_model_dir):
    open_addr = "transport.control_addr=tcp://0.0.0.0:*"
    with pytest.raises(ConfigError, match=r"refusing to listen on transport.control_addr \("):
        preflight(config(tiny_model_dir, open_addr), "trainer")
    preflight(config(tiny_model_dir, open_addr, "transport.allow_insecure=true"), "trainer")


def test_each_role_s_keys_are_read_before_it_starts(tiny_model_dir, tmp_path):
    keys = tmp_path / "keys"
    with pytest.raises(ConfigError, match="transport.curve_dir: no such directory"):
        preflight(config(tiny_model_dir, f"transport.curve_dir={keys}"), "both")
    generate(keys, 1)
    cfg = config(tiny_model_dir, f"transport.curve_dir={keys}")
    preflight(cfg, "both")
    (keys / "trainer.key_secret").unlink()  # a sampler's node holds no trainer secret
    preflight(cfg, "sampler")
    with pytest.raises(ConfigError, match="cannot read the trainer's secret key"):
        preflight(cfg, "trainer")
    (keys / "sampler-0.key_secret").chmod(0o644)
    with pytest.raises(ConfigError, match="sampler-0.key_secret is readable by group or others"):
        preflight(cfg, "sampler")


def test_the_attention_kernel_and_the_ranks_must_fit_the_node(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(preflight_module, "visible_gpus", lambda: [])
    monkeypatch.setattr(preflight_module.os, "sched_getaffinity", lambda pid: {0, 1})
    for kernel in ("flex_attention", "flash_attention_2"):
        with pytest.raises(ConfigError, match=f"attn_implementation={kernel} trains on a GPU"):
            preflight(config(tiny_model_dir, f"model.attn_implementation={kernel}"), "sampler")
    with pytest.raises(ConfigError, match="train.num_ranks=4: this node has no GPU and 2 CPU"):
        preflight(config(tiny_model_dir, "train.num_ranks=4"), "trainer")
    preflight(config(tiny_model_dir, "train.num_ranks=2"), "trainer")
    # With GPUs the kernels are the GPU's business (and the ranks are placement's)
    monkeypatch.setattr(preflight_module, "visible_gpus", lambda: ["0", "1", "2", "3"])
    preflight(config(tiny_model_dir, "model.attn_implementation=flex_attention",
                     "train.num_ranks=4"), "trainer")  # fmt: skip


def test_a_dataset_s_rows_are_read_as_the_sampler_will_read_them(tiny_model_dir, tmp_path):
    """A parquet of one's own whose columns are not named as the task reads them: the
    message names the fix (rows.columns), and with it the same file passes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"problem": ["What is 2 + 2?"], "solution": ["2 + 2 = 4. #### 4"]}),
                   path)  # fmt: skip
    cfg = config(tiny_model_dir, f"data.train={path}")
    with pytest.raises(ConfigError) as e:
        preflight(cfg, "sampler")
    assert str(e.value).startswith(f"data.train: {path}: row 0 has no 'question' key")
    assert str(e.value).endswith("name the column that holds it with rows.columns=[question="
                                 "<column>]")  # fmt: skip
    preflight(config(tiny_model_dir, f"data.train={path}",
                     "rows.columns=[question=problem,answer=solution]"), "sampler")  # fmt: skip


def test_a_hub_id_is_taken_from_the_local_cache_and_never_downloaded(tiny_model_dir, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    import shutil

    from huggingface_hub import constants

    from grpo.models.embedded import require_model_dir

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny-model" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snapshot)
    (cache / "models--someone--tiny-model" / "refs").mkdir()
    (cache / "models--someone--tiny-model" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on this machine: no hub to fall back on
    assert require_model_dir("someone/tiny-model") == snapshot
    preflight(config("someone/tiny-model"), "both")
    with pytest.raises(ConfigError, match="'someone/other' is neither a model dir nor a hub id "
                                          "in the local cache; download it once"):  # fmt: skip
        preflight(config("someone/other"), "both")


def test_a_model_without_a_chat_template_is_refused(tiny_model_dir, tmp_path):
    """A base model's tokenizer has no template; the prompts are chats."""
    import json
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    for name in ("chat_template.jinja", "chat_template.json"):
        (base / name).unlink(missing_ok=True)
    settings = json.loads((base / "tokenizer_config.json").read_text())
    template = settings.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(ConfigError, match="has no chat template .a base model..: the prompts"):
        preflight(config(base), "sampler")
    (base / "chat_template.jinja").write_text(template or "{{ messages }}")
    preflight(config(base), "sampler")


def test_the_config_s_paths_are_the_user_s_where_the_user_has_them(tmp_path, monkeypatch):
    """launch.sh runs the roles from the repository: a relative path the user has where they
    started (GRPO_USER_DIR) becomes absolute when the config loads, so every reader (the
    DeepSpeed config, the CURVE keys of each channel) opens the user's; a hub id or a path the
    user does not have is left as given."""
    from grpo.config import load_config

    (tmp_path / "my_ds.json").write_text("{}")
    (tmp_path / "keys").mkdir()
    monkeypatch.setenv("GRPO_USER_DIR", str(tmp_path))
    cfg = load_config(None, ["train.deepspeed_config=my_ds.json", "transport.curve_dir=keys",
                             "model.path=someone/model", "data.train=not_mine.jsonl"])  # fmt: skip
    assert cfg.train.deepspeed_config == str(tmp_path / "my_ds.json")
    assert cfg.transport.curve_dir == str(tmp_path / "keys")
    assert (cfg.model.path, cfg.data.train) == ("someone/model", "not_mine.jsonl")


def test_a_vllm_backend_without_vllm_is_named_before_any_model_loads(tiny_model_dir, monkeypatch):
    """The demo's sampler runs vLLM: a venv set up without --vllm gets the command that adds it,
    in one line, where it once failed after the trainer had started."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))  # fmt: skip
    cfg = config(tiny_model_dir, "rollout.backend=vllm")
    with pytest.raises(ConfigError, match=r"vllm is not installed: bash scripts/setup.sh --vllm"):
        preflight(cfg, "sampler")
    preflight(config(tiny_model_dir), "sampler")  # HF needs nothing more


def test_what_the_run_opens_past_the_model_dir_is_opened_first(tiny_model_dir, tmp_path):
    """Issue 64, item 2: `grpo check` said "config ok" and the run then died on a model dir
    without tokenizer files (30 s in), data.test rows without the task's columns (19 s), an
    unwritable output_dir (16 s), and a mistyped LoRA target, which trained the rest silently."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    for name in preflight_module.TOKENIZER_FILES:
        (bare / name).unlink(missing_ok=True)
    with pytest.raises(ConfigError, match=r"^model.path: .* has no tokenizer \(none of tokenizer"):
        preflight(config(bare), "trainer")

    rows = tmp_path / "test.jsonl"
    rows.write_text('{"problem": "What is 2 + 2?", "solution": "#### 4"}\n')
    with pytest.raises(ConfigError, match=r"^data.test: .*row 0 has no 'question' key"):
        preflight(config(tiny_model_dir, f"data.test={rows}", "eval.interval=5"), "trainer")
    preflight(config(tiny_model_dir, f"data.test={rows}"), "trainer")  # no evaluation: unread

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for where in (a_file / "runs", "/proc/no_run_dir_here"):
        with pytest.raises(ConfigError, match=r"^output_dir: cannot write the run dir"):
            preflight(config(tiny_model_dir, f"output_dir={where}"), "trainer")

    lora = ["model.lora.enabled=true", "model.lora.target_modules=[q_prj, v_proj]"]
    with pytest.raises(ConfigError) as e:
        preflight(config(tiny_model_dir, *lora), "sampler")
    assert str(e.value).startswith("model.lora.target_modules: q_prj match no module of ")
    assert "its linear layers: " in str(e.value) and "q_proj" in str(e.value)
    named = "model.lora.target_modules=[q_proj, model.layers.0.mlp.up_proj]"  # a part, a name
    preflight(config(tiny_model_dir, "model.lora.enabled=true", named), "both")


def test_lora_targets_are_checked_against_the_embedded_model_too(base_model_dir):
    """The demo's config (model.path embedded) with `[q_prj, v_proj]` said "config ok" and
    trained v_proj alone: the check looked only at a model dir the config names (issue 64's
    mistake table, row 26). Once converted, the embedded model's dir is there to look at."""
    lora = ["model.lora.enabled=true", "model.lora.target_modules=[q_prj, v_proj]"]
    with pytest.raises(ConfigError, match=r"^model.lora.target_modules: q_prj match no module"):
        preflight(config("embedded", *lora), "sampler")
    preflight(config("embedded", "model.lora.enabled=true"), "sampler")  # the default targets


def test_second_sources_and_second_values_of_what_the_run_opens(tiny_model_dir, tmp_path):
    """Issue 63: each check above met one case of what it is about. transformers also reads a
    template from tokenizer_config.json and builds a tokenizer from sentencepiece's model or a
    BPE vocabulary; evaluating every version (interval 1) reads data.test too; a run dir that
    is there but is a file cannot be written, however writable its parent."""
    import json
    import shutil

    from grpo.preflight import has_chat_template

    inside = tmp_path / "inside"
    inside.mkdir()
    (inside / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert has_chat_template(inside)
    (inside / "tokenizer_config.json").write_text(json.dumps({"chat_template": ""}))
    assert not has_chat_template(inside)

    for kept in ("tokenizer.model", "vocab.json"):
        model = tmp_path / kept
        shutil.copytree(tiny_model_dir, model)
        for name in preflight_module.TOKENIZER_FILES:
            (model / name).unlink(missing_ok=True)
        (model / kept).write_text("")
        preflight(config(model), "trainer")  # a tokenizer file is there: not refused

    rows = tmp_path / "test.jsonl"
    rows.write_text('{"problem": "What is 2 + 2?", "solution": "#### 4"}\n')
    with pytest.raises(ConfigError, match=r"^data.test: .*row 0 has no 'question' key"):
        preflight(config(tiny_model_dir, f"data.test={rows}", "eval.interval=1"), "trainer")

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "taken").write_text("")
    with pytest.raises(ConfigError, match=r"^output_dir: cannot write the run dir"):
        preflight(config(tiny_model_dir, f"output_dir={tmp_path / 'runs'}", "name=taken"),
                  "trainer")  # fmt: skip
