"""The training loop: receive a batch, split whole groups across ranks, GRPO/GSPO step, publish.

Rank 0 owns the ZeroMQ channel; it broadcasts each received batch as one encoded blob (the same
pickle-free frames that crossed the wire) so every rank decodes exactly what rank 0 received.
Weights after step s are version s; every `train.sync_interval` steps rank 0 publishes them.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import shutil
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo.algos import (
    adaptive_kl_coef,
    agg_loss,
    broadcast_to_tokens,
    gae,
    get_policy_loss,
    kl_penalty,
    masked_mean,
    overlong_penalty,
    policy_loss,
    token_level_rewards,
)
from grpo.algos.correction import logp_abs_diff, rollout_correction_weights
from grpo.algos.registry import advantage_kind
from grpo.config import Config, save_config
from grpo.core.batching import length_mask, pad_right
from grpo.core.episode import Episode, EpisodeBatch
from grpo.delivery.admission import Expected, misfit
from grpo.delivery.ledger import Ledger
from grpo.delivery.versions import discard_versions_after, publish_version, write_atomic
from grpo.logprobs import Truncation, pairs_logprobs, score_for_training
from grpo.metrics import (
    METRICS_FILE,
    SAMPLERS_FILE,
    append_jsonl,
    info_rates,
    mean,
    peak_memory_gib,
    per_sampler,
    plot_run,
    read_jsonl,
)
from grpo.models import (
    apply_lora,
    load_causal_lm,
    load_reference,
    load_tokenizer,
    resolve_model_path,
)
from grpo.trainer import state as train_state
from grpo.trainer.critic import Critic
from grpo.trainer.ranks import (
    accumulate_backward,
    collective_failure,
    collective_timeout_s,
    comm_device,
    max_across_ranks,
    micro_batches,
    sum_across_ranks,
)
from grpo.wire import messages
from grpo.wire.channels import PeerError, TrainerChannel
from grpo.wire.codec import bytes_to_frames, decode, encode_batch, frames_to_bytes

log = logging.getLogger("grpo.trainer")

# Broadcast in place of a blob length: rank 0 is ending the run / is still waiting.
STOP, KEEPALIVE = -1, -2
KEEPALIVE_S = 60.0


# ----------------------------------------------------------------------------- set-up


def deepspeed_config(cfg: Config, world: int, seqs_per_step: int) -> dict[str, Any]:
    """The JSON file's settings with the batch geometry and optimiser values from our config;
    `seqs_per_step` is one rank's sequences per optimizer step (its mini-batch)."""
    path = Path(cfg.train.deepspeed_config)
    try:
        ds = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"train.deepspeed_config: no file {path}") from None
    micro = min(cfg.train.micro_batch_size, seqs_per_step)
    gas = math.ceil(seqs_per_step / micro)
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["gradient_accumulation_steps"] = gas
    ds["train_batch_size"] = micro * gas * world
    ds["gradient_clipping"] = cfg.train.max_grad_norm
    ds["bf16"] = {"enabled": cfg.model.dtype == "bfloat16"}  # fp32 master weights either way
    params = ds.setdefault("optimizer", {"type": "AdamW"}).setdefault("params", {})
    params.update(lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    return ds


def rotate_run_dir(run_dir: Path) -> None:
    """A new run never mixes with an old one: the previous run moves to <name>.prev."""
    if run_dir.exists() and any(run_dir.iterdir()):
        prev = run_dir.with_name(run_dir.name + ".prev")
        shutil.rmtree(prev, ignore_errors=True)
        os.replace(run_dir, prev)
        log.info("previous run moved to %s", prev)
    run_dir.mkdir(parents=True, exist_ok=True)


# ----------------------------------------------------------------------------- one step


def shaped_rewards(batch: EpisodeBatch, cfg: Config) -> torch.Tensor:
    """Per-episode rewards (N,), with DAPO's overlong penalty when algo.overlong_buffer > 0."""
    rewards = torch.tensor([e.reward for e in batch.episodes], dtype=torch.float32)
    if cfg.algo.overlong_buffer:
        lengths = torch.tensor([len(e.completion_ids) for e in batch.episodes])
        rewards = rewards + overlong_penalty(
            lengths, cfg.rollout.max_new_tokens, cfg.algo.overlong_buffer, cfg.algo.overlong_factor
        )
    return rewards


def token_rewards(
    batch: EpisodeBatch, cfg: Config, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(N, C) per-token rewards, their mask, and the mean per-token KL(old || ref).

    The (shaped) score sits on each answer's last token; with algo.kl_in_reward every token
    also pays kl_coef * KL between the sampling policy and the reference (PPO-RLHF style)."""
    eps = batch.episodes
    mask = length_mask([len(e.completion_ids) for e in eps])  # (N, C)
    rewards = token_level_rewards(shaped_rewards(batch, cfg), mask)  # (N, C)
    old = pad_right([e.old_logp for e in eps], mask.shape[1])
    ref = pad_right([e.ref_logp for e in eps], mask.shape[1])
    kl = kl_penalty(old, ref, cfg.algo.kl_reward_kind) * mask  # (N, C)
    mean_kl = float(masked_mean(kl, mask))
    if cfg.algo.kl_in_reward:
        rewards = rewards - kl_coef * kl
    return rewards, mask, mean_kl


def compute_advantages(
    batch: EpisodeBatch, cfg: Config, kl_coef: float = 0.0
) -> tuple[list[torch.Tensor], float]:
    """Token advantages of every episode of the whole batch (each rank computes all of them,
    so batch-level whitening and group baselines see the full batch): one (C_i,) per episode,
    and the batch's mean KL(old || ref) per token. Not for gae, which needs the critic."""
    rewards, mask, mean_kl = token_rewards(batch, cfg, kl_coef)
    return advantages_from_rewards(batch, rewards, mask, cfg), mean_kl


def advantages_from_rewards(
    batch: EpisodeBatch, rewards: torch.Tensor, mask: torch.Tensor, cfg: Config
) -> list[torch.Tensor]:
    kind, estimator = advantage_kind(cfg.algo.advantage)
    if kind == "token":
        token_adv = estimator(rewards, mask, gamma=cfg.algo.gamma)
    else:  # outcome estimators see each answer's total reward
        outcome = estimator(rewards.sum(dim=-1), batch.group_size)
        token_adv = broadcast_to_tokens(outcome, mask)
    return per_episode(mask_truncated(token_adv, batch, cfg), batch)


def rollout_correction(
    batch: EpisodeBatch, cfg: Config
) -> tuple[list[torch.Tensor] | None, dict[str, float]]:
    """Per-episode importance weights for algo.rollout_correction (None when off), and the
    metrics comparing the engine's log-probs with the old ones, whenever both exist.

    `rollout_logp` is already on the full vocabulary (see Sampler.score / score_on_ranks),
    so the ratio compares like with like under top-p / top-k too."""
    eps = batch.episodes
    if batch.columns.rollout_logp is None or batch.columns.old_logp is None:
        return None, {}
    mask = length_mask([len(e.completion_ids) for e in eps])  # (N, C)
    old = pad_right([e.old_logp for e in eps], mask.shape[1])
    rollout = pad_right([e.rollout_logp for e in eps], mask.shape[1])
    metrics = {"rollout_vs_old_logp_abs_diff": logp_abs_diff(old, rollout, mask)}
    if cfg.algo.rollout_correction == "none":
        return None, metrics
    weights, more = rollout_correction_weights(
        old, rollout, mask, cfg.algo.rollout_correction, cfg.algo.rollout_correction_threshold
    )
    return per_episode(weights, batch), metrics | more


def in_loss(e: Episode, cfg: Config) -> bool:
    """False for an answer cut at max_new_tokens when algo.mask_truncated is on."""
    return not (cfg.algo.mask_truncated and e.finish_reason == "length")


def mask_truncated(token_adv: torch.Tensor, batch: EpisodeBatch, cfg: Config) -> torch.Tensor:
    # DAPO: a cut-off answer says nothing about its ending
    token_adv[[not in_loss(e, cfg) for e in batch.episodes]] = 0.0
    return token_adv


def per_episode(rows: torch.Tensor, batch: EpisodeBatch) -> list[torch.Tensor]:
    """(N, C) padded rows -> one (C_i,) tensor per episode."""
    return [rows[i, : len(e.completion_ids)] for i, e in enumerate(batch.episodes)]


def gae_across_ranks(
    rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on this rank's episodes, whitened with the mean and std of all ranks' tokens.

    (B, C) each -> (advantages, returns). Each rank holds only its own values, so the batch
    statistics of the whitening are summed across ranks."""
    _, returns = gae(rewards, values, mask, gamma, lam)
    raw = (returns - values) * mask  # (B, C) unwhitened advantages
    n, total, square = sum_across_ranks(
        torch.stack([mask.sum(), raw.sum(), (raw.square() * mask).sum()]).double()
    ).tolist()
    mean = total / max(n, 1.0)
    std = max(square / max(n, 1.0) - mean**2, 0.0) ** 0.5
    return (raw - mean) / (std + 1e-8) * mask, returns


def mini_batch_seqs(cfg: Config, world: int) -> int:
    """Sequences per optimizer step on one rank."""
    if cfg.train.mini_batch_size:
        return cfg.train.mini_batch_size // world
    return cfg.rollout.questions_per_step * cfg.rollout.group_size // world


def train_on_batch(
    engine,
    batch: EpisodeBatch,
    advantages: list[torch.Tensor],
    cfg: Config,
    pad_id: int,
    weights: list[torch.Tensor] | None = None,
) -> dict[str, float]:
    """`train.ppo_epochs` passes over this rank's episodes, one optimizer step per mini-batch.

    `advantages` holds the token advantages of this rank's episodes, in order, and `weights`
    their rollout-correction weights (or None). The ratio's old log-probs are those recorded
    before the first update (by the sampler or the trainer), in every pass. Metrics stay on
    the device until the end: one transfer per batch, not one per micro-batch.
    """
    size = mini_batch_seqs(cfg, dist.get_world_size())
    eps, sums, total = batch.episodes, {}, 0.0
    for _ in range(cfg.train.ppo_epochs):
        for start in range(0, len(eps), size):
            part = slice(start, start + size)
            metrics, tokens = optimizer_step(
                engine,
                eps[part],
                advantages[part],
                cfg,
                pad_id,
                None if weights is None else weights[part],
            )
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + tokens * value
            total += tokens
    out = {key: float(value) / max(total, 1.0) for key, value in sums.items()}
    grad_norm = engine.get_global_grad_norm()  # of the last step; None or inf when skipped
    if grad_norm is not None and math.isfinite(float(grad_norm)):
        out["grad_norm"] = float(grad_norm)
    return out


def resolved_loss_options(cfg: Config) -> tuple[str, float, float]:
    """(agg, clip_low, clip_high): null in the config = the chosen loss's own default (e.g.
    GSPO's 3e-4 / 4e-4 and seq-mean-token-mean)."""
    algo = cfg.algo
    agg, clip_low, clip_high = (
        loss_default(algo.loss, key) if value is None else value
        for key, value in (("agg", algo.agg), ("clip_low", algo.clip_low),
                           ("clip_high", algo.clip_high))
    )  # fmt: skip
    return agg, clip_low, clip_high


def micro_batch_loss(
    model,
    chunk: list[Episode],
    advantages: list[torch.Tensor],
    weights: list[torch.Tensor] | None,
    cfg: Config,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch, its (B, C) loss mask and its metrics (0-d tensors), all on
    the model's device: the per-episode inputs arrive on the CPU and are moved here, once."""
    algo = cfg.algo
    agg, clip_low, clip_high = resolved_loss_options(cfg)
    logp, entropy, mask, _ = pairs_logprobs(
        model,
        [e.prompt_ids for e in chunk],
        [e.completion_ids for e in chunk],
        packed=cfg.packed,
        pad_id=pad_id,
        temperature=cfg.rollout.temperature,
        with_entropy=True,
        entropy_grad=algo.entropy_coef > 0,
    )
    device = logp.device
    mask[[not in_loss(e, cfg) for e in chunk]] = 0.0  # DAPO: truncated answers get no loss
    width = mask.shape[1]
    old = pad_right([e.old_logp for e in chunk], width).to(device)
    ref = pad_right([e.ref_logp for e in chunk], width).to(device)
    adv = pad_right(advantages, width).to(device)
    is_w = None if weights is None else pad_right(weights, width).to(device)
    if agg == "seq-mean-token-sum-norm":
        # Dr. GRPO divides by a constant, the longest possible answer, not by this
        # micro-batch's longest: widen the loss inputs (not the forward) to it.
        width = max(width, cfg.rollout.max_new_tokens)
        old, ref, adv, mask, logp, entropy = (
            widen(t, width) for t in (old, ref, adv, mask, logp, entropy)
        )
        is_w = None if is_w is None else widen(is_w, width)
    pg_loss, pg_metrics = policy_loss(
        algo.loss,
        old,
        logp,
        adv,
        mask,
        agg=agg,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=algo.clip_c,
        weights=is_w,  # rollout correction
    )
    kl = kl_penalty(logp, ref, algo.kl_kind)
    loss = pg_loss + algo.kl_loss_coef * agg_loss(kl, mask, agg)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * agg_loss(entropy, mask, agg)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "kl": masked_mean(kl, mask),
            "entropy": masked_mean(entropy, mask),
            "clip_frac": pg_metrics["clip_frac"],
            "approx_kl": pg_metrics["approx_kl"],
        }
    return loss, mask, metrics


def optimizer_step(
    engine,
    eps: tuple[Episode, ...],
    advantages: list[torch.Tensor],
    cfg: Config,
    pad_id: int,
    weights: list[torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """Forward/backward every micro-batch of one mini-batch, then one optimizer step.

    Returns token-weighted mean metrics (0-d tensors on the device) and this rank's token
    count."""
    agg = resolved_loss_options(cfg)[0]
    n_tokens = max(1, sum(len(e.completion_ids) for e in eps if in_loss(e, cfg)))
    # token-mean is over the tokens of all ranks: each rank's gradient gets its token share
    # (DeepSpeed then averages the ranks, hence the factor `world` below).
    world = dist.get_world_size()
    all_tokens = float(sum_across_ranks(torch.tensor([float(n_tokens)])))
    parts = micro_batches(eps, cfg, engine.train_micro_batch_size_per_gpu())
    sums: dict[str, torch.Tensor] = {}
    for i, part in enumerate(parts):
        chunk = [eps[j] for j in part]
        loss, mask, metrics = micro_batch_loss(
            engine,
            chunk,
            [advantages[j] for j in part],
            None if weights is None else [weights[j] for j in part],
            cfg,
            pad_id,
        )
        # The one sync per micro-batch, and a needed one: a non-finite loss stops the run
        # before the optimizer applies it.
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite loss ({float(loss)}): lower train.lr or check the rewards; "
                "this optimizer step was not applied and nothing more was published"
            )
        # Weight each micro-batch by its share of the mini-batch's tokens (or of the rank's
        # sequences): the sum is the aggregate over the mini-batch, not a mean of micro-batch
        # means.
        tokens = mask.sum()
        if agg == "token-mean":
            share = tokens / max(all_tokens, 1.0) * world
        else:
            share = len(chunk) / len(eps)
        accumulate_backward(engine, loss * share, last=i == len(parts) - 1)
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + tokens / n_tokens * value
    return sums, float(n_tokens)


def widen(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, C) -> (B, width) with zeros on the right."""
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def loss_default(loss_name: str, option: str) -> Any:
    """A registered policy loss's own default for `option` (what `null` in the config means)."""
    return inspect.signature(get_policy_loss(loss_name)).parameters[option].default


def batch_metrics(batch: EpisodeBatch) -> dict[str, Any]:
    """Sampler-side numbers of the whole batch: reward, accuracy, format, lengths, timings.

    The per-episode prompt and completion lengths are kept too (bench/padding.py replays them)."""
    c = batch.columns
    infos = list(c.reward_info)
    row = {
        "reward_mean": float(c.reward.mean()),
        "reward_std": float(c.reward.std(ddof=1)) if len(c) > 1 else 0.0,
        **info_rates(infos),
        "reward_errors": sum("reward_error" in i for i in infos),
        "response_len_mean": float(c.completion_len.mean()),
        "truncated_frac": mean([float(r == "length") for r in c.finish_reason]),
        "prompt_lens": c.prompt_len.tolist(),
        "completion_lens": c.completion_len.tolist(),
    }
    row.update({f"sampler_{k}": v for k, v in batch.stats.items()})
    return row


# ----------------------------------------------------------------------------- distribution


def broadcast_size(value: int) -> int:
    size = torch.tensor([value], dtype=torch.long, device=comm_device())
    dist.broadcast(size, src=0)
    return int(size)


def broadcast_batch(
    batch: EpisodeBatch | None, rank: int, max_frame_bytes: int
) -> EpisodeBatch | None:
    """Rank 0's batch to every rank as one uint8 tensor; None (from rank 0) means stop.

    The other ranks wait here while rank 0 waits for the sampler; rank 0 sends KEEPALIVE now
    and then so that their collective does not time out during a long generation.
    """
    if rank != 0:
        size = KEEPALIVE
        while size == KEEPALIVE:
            size = broadcast_size(0)
        if size == STOP:
            return None
        buf = torch.empty(size, dtype=torch.uint8, device=comm_device())
        dist.broadcast(buf, src=0)
        return decode(bytes_to_frames(buf.cpu().numpy()), max_frame_bytes=max_frame_bytes)  # type: ignore[return-value]
    if batch is None:
        broadcast_size(STOP)
        return None
    blob = frames_to_bytes(encode_batch(batch))
    broadcast_size(len(blob))
    dist.broadcast(torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(comm_device()), src=0)
    return batch


def average_across_ranks(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    total = sum_across_ranks(torch.tensor([values[k] for k in keys], dtype=torch.float64))
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, total, strict=True)}


def gather_group_ids(batch: EpisodeBatch) -> list[list[int]]:
    ids = torch.tensor([g[0].group_id for g in batch.groups()], dtype=torch.long)
    ids = ids.to(comm_device())
    out = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
    dist.all_gather(out, ids)
    return [t.tolist() for t in out]


# ----------------------------------------------------------------------------- the loop


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if cfg.rollout.questions_per_step % self.world:
            raise ValueError(
                f"{cfg.rollout.questions_per_step} groups per batch cannot be split evenly over "
                f"{self.world} ranks: make rollout.questions_per_step a multiple of {self.world}"
            )
        self.groups_per_rank = cfg.rollout.questions_per_step // self.world
        torch.manual_seed(cfg.train.seed)
        if cfg.model.attn_implementation == "flex_attention" and not torch.cuda.is_available():
            raise ValueError(
                "model.attn_implementation=flex_attention trains on GPU only (PyTorch has no "
                "CPU backward for it): use sdpa on CPU"
            )
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(self.model_path)
        model = load_causal_lm(self.model_path, cfg.model.dtype, cfg.model.attn_implementation)
        self.expected = Expected(
            groups=cfg.rollout.questions_per_step,
            group_size=cfg.rollout.group_size,
            logprobs_on=cfg.train.logprobs_on,
            vocab_size=model.get_input_embeddings().num_embeddings,
        )
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if cfg.model.lora.enabled:
            model = apply_lora(model, cfg.model.lora)
        import deepspeed

        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(cfg, self.world, mini_batch_seqs(cfg, self.world)),
        )
        self.engine.train()  # from_pretrained returns eval mode: no checkpointing, no dropout
        self.critic = (
            Critic(cfg, deepspeed_config(cfg, self.world, mini_batch_seqs(cfg, self.world)))
            if cfg.algo.advantage == "gae"
            else None
        )
        # train.logprobs_on: trainer: the old and reference log-probs are computed here.
        self.reference = None
        if cfg.train.logprobs_on == "trainer":
            self.reference = load_reference(
                self.model_path, cfg.model.dtype, cfg.model.attn_implementation
            ).to(self.engine.device)
        self.run_dir = cfg.run_dir
        self.channel: TrainerChannel | None = None
        self.version = 0
        self.kl_reward_coef = cfg.algo.kl_reward_coef  # adapted each step with kl_ctrl adaptive
        self.ledger = Ledger()
        self.duplicates_dropped = 0
        self.rejected_batches = 0
        self.start_step = 0
        if cfg.train.resume != "never":
            self.resume()

    # ------------------------------------------------------------------ durable state

    @property
    def engines(self) -> dict[str, Any]:
        return {"policy": self.engine} | ({"critic": self.critic.engine} if self.critic else {})

    def state_fingerprint(self) -> dict[str, Any]:
        """What a saved state must share with this run to be resumed (ZeRO-2 shards the
        optimizer per rank, so the world size is one of them)."""
        cfg = self.cfg
        return {
            "world": self.world,
            "questions_per_step": cfg.rollout.questions_per_step,
            "group_size": cfg.rollout.group_size,
            "lora": cfg.model.lora.enabled,
            "critic": self.critic is not None,
        }

    def resume(self) -> None:
        state_dir = self.run_dir / "train_state"
        resumed = train_state.load(state_dir, self.engines, self.state_fingerprint())
        if resumed is None:
            if self.cfg.train.resume == "always":
                raise ValueError(f"--resume: no complete training state in {state_dir}")
            return
        self.start_step, self.version = resumed.step, resumed.version
        self.kl_reward_coef, self.ledger = resumed.kl_reward_coef, resumed.ledger
        if self.rank == 0:
            log.info(
                "resumed from %s at step %d (%d batches in its ledger)",
                state_dir,
                self.start_step,
                sum(len(s) for s in self.ledger.durable.values()),
            )

    def skipped_steps(self) -> dict[str, int]:
        """Optimizer steps each engine has skipped so far (DeepSpeed skips a step whose
        gradients are not finite, as bf16 overflows make them, and only counts it)."""
        return {name: engine.skipped_steps for name, engine in self.engines.items()}

    def save_state(self, step: int) -> None:
        """All ranks: the training state of `step` on disk, then its batches acknowledged."""
        client_state = {
            "step": step,
            "version": self.version,
            "kl_reward_coef": self.kl_reward_coef,
            "ledger": self.ledger.consumed_json(),
        }
        state_dir = self.run_dir / "train_state"
        train_state.save(state_dir, step, self.engines, client_state, self.state_fingerprint())
        self.ledger.mark_durable()
        if self.channel is not None:
            self.channel.acks = self.ledger.acks()

    def publish(self, step: int) -> float:
        """Rank 0 writes version `step` (full weights or the LoRA adapter) and announces it."""
        t0 = time.monotonic()
        module = self.engine.module

        def save(tmp: Path) -> None:
            if self.cfg.model.lora.enabled:
                module.save_pretrained(tmp)  # the adapter only
            else:  # the in-memory layout, which the sampler's load_state_dict expects
                module.save_pretrained(tmp, save_original_format=False)
            self.tokenizer.save_pretrained(tmp)

        publish_version(self.run_dir, step, save, self.cfg.train.keep_versions, step)
        self.version = step
        assert self.channel is not None
        self.channel.published_version = step
        self.channel.announce(messages.VERSION, version=step)
        return time.monotonic() - t0

    def ppo_step(
        self,
        step: int,
        mine: EpisodeBatch,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        weights: list[torch.Tensor] | None,
    ) -> dict[str, float]:
        """PPO with a critic: values before the update, GAE, then policy and critic updates."""
        assert self.critic is not None
        cfg, pad = self.cfg, self.tokenizer.pad_token_id
        old_values = pad_right(self.critic.values(mine.episodes, pad), mask.shape[1])
        adv, returns = gae_across_ranks(rewards, mask, old_values, cfg.algo.gamma, cfg.algo.lam)
        advantages = per_episode(mask_truncated(adv, mine, cfg), mine)
        metrics: dict[str, float] = {}
        if step > cfg.critic.warmup_steps:  # during the critic's warm-up the policy waits
            metrics = train_on_batch(self.engine, mine, advantages, cfg, pad, weights)
        size = mini_batch_seqs(cfg, self.world)
        eps, targets, olds = (
            mine.episodes,
            per_episode(returns, mine),
            per_episode(old_values, mine),
        )
        passes = 0
        for _ in range(cfg.train.ppo_epochs):
            for s in range(0, len(eps), size):
                vf = self.critic.update(eps[s : s + size], targets[s : s + size],
                                        olds[s : s + size], pad)  # fmt: skip
                for key, value in vf.items():
                    metrics[key] = metrics.get(key, 0.0) + value
                passes += 1
        for key in vf:
            metrics[key] /= passes
        return metrics

    def reject(self, batch: EpisodeBatch, why: str) -> None:
        """Drop a batch this trainer cannot train on, and tell its sampler, which stops with
        the reason: the run goes on for any other sampler, and a peer cannot end it this way."""
        assert self.channel is not None
        self.rejected_batches += 1
        log.warning("dropped batch %d from %s (%d so far): %s", batch.seq, batch.sampler_id,
                    self.rejected_batches, why)  # fmt: skip
        self.channel.announce(
            messages.REJECTED, sampler_id=batch.sampler_id, seq=batch.seq, reason=why
        )

    def receive(self) -> tuple[EpisodeBatch | None, float]:
        """Rank 0 waits for the next batch, keeping the other ranks' broadcast alive; if that
        fails, the other ranks are told to stop."""
        if self.rank != 0:
            return None, 0.0
        assert self.channel is not None
        t0 = time.monotonic()
        try:
            while True:
                batch = self.channel.recv_batch(wait_s=KEEPALIVE_S)
                if batch is None:
                    broadcast_size(KEEPALIVE)
                elif self.ledger.is_duplicate(batch.sampler_id, batch.seq):
                    self.duplicates_dropped += 1  # a resend of a batch already trained on
                    log.info("dropped batch %d from %s: already trained on", batch.seq,
                             batch.sampler_id)  # fmt: skip
                elif (why := misfit(batch, self.expected)) is not None:
                    self.reject(batch, why)
                else:
                    break
        except BaseException:
            broadcast_batch(None, 0, self.cfg.transport.max_frame_bytes)
            raise
        return batch, time.monotonic() - t0

    def score_on_ranks(self, batch: EpisodeBatch) -> EpisodeBatch:
        """train.logprobs_on: trainer: old (current weights, before this step's first update)
        and reference log-probs of the whole batch, each rank scoring its own groups.

        The engine's log-probs are put on the full vocabulary here, as the sampler does when
        it scores (grpo.logprobs.score_for_training)."""
        cfg, r = self.cfg, self.cfg.rollout
        g0 = self.rank * self.groups_per_rank
        mine = batch.select_groups(g0, g0 + self.groups_per_rank).episodes
        scored = score_for_training(
            self.engine.module,
            self.reference,
            [e.prompt_ids for e in mine],
            [e.completion_ids for e in mine],
            [e.rollout_logp for e in mine],
            truncation=Truncation(r.top_p, r.top_k),
            pad_id=self.tokenizer.pad_token_id,
            temperature=r.temperature,
            packed=cfg.packed,
            batch_size=cfg.train.micro_batch_size,
        )
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, scored)  # among the trainer ranks, never on the wire
        arrays = {
            name: [a for rank in gathered for a in rank[i]]
            for i, name in enumerate(("old_logp", "ref_logp", "rollout_logp"))
        }
        if batch.columns.rollout_logp is None:
            del arrays["rollout_logp"]
        return batch.with_arrays(**arrays)

    def step(self, step: int, batch: EpisodeBatch, recv_s: float) -> dict[str, Any]:
        t_score = time.monotonic()
        if self.reference is not None:
            batch = self.score_on_ranks(batch)
        score_s = time.monotonic() - t_score
        t0 = time.monotonic()
        g0, G = self.rank * self.groups_per_rank, batch.group_size
        mine = batch.select_groups(g0, g0 + self.groups_per_rank)
        lo, hi = g0 * G, (g0 + self.groups_per_rank) * G
        rewards, mask, rollout_kl = token_rewards(batch, self.cfg, self.kl_reward_coef)
        weights, correction_metrics = rollout_correction(batch, self.cfg)
        weights = None if weights is None else weights[lo:hi]
        pad = self.tokenizer.pad_token_id
        skipped_before = self.skipped_steps()
        if self.critic is None:
            advantages = advantages_from_rewards(batch, rewards, mask, self.cfg)[lo:hi]
            local = train_on_batch(self.engine, mine, advantages, self.cfg, pad, weights)
        else:
            local = self.ppo_step(step, mine, rewards[lo:hi], mask[lo:hi], weights)
        train_metrics = average_across_ranks(local)
        kl_coef_used = self.kl_reward_coef
        if self.cfg.algo.kl_in_reward and self.cfg.algo.kl_ctrl == "adaptive":
            algo = self.cfg.algo  # every rank sees the same batch: the same update everywhere
            self.kl_reward_coef = adaptive_kl_coef(
                self.kl_reward_coef,
                rollout_kl,
                algo.kl_target,
                algo.kl_horizon,
                len(batch.episodes),
            )
        groups = gather_group_ids(mine)
        skipped = {k: n - skipped_before[k] for k, n in self.skipped_steps().items()}
        for engine, n in skipped.items():
            if n:  # DeepSpeed found non-finite gradients (bf16 overflow) and did not step
                log.warning("step %d: %d %s optimizer step(s) skipped: non-finite gradients",
                            step, n, engine)  # fmt: skip
        train_s = time.monotonic() - t0
        c = batch.columns  # the ranks train their shares at once: the batch's tokens / train_s
        batch_tokens = int(c.prompt_len.sum() + c.completion_len.sum())
        trained_tokens = self.cfg.train.ppo_epochs * batch_tokens
        peak_mem = float(max_across_ranks(torch.tensor([peak_memory_gib()])))
        self.ledger.consume(batch.sampler_id, batch.seq)
        if self.channel is not None:
            self.channel.consumed = self.ledger.consumed_json()
        publish_s = 0.0
        last = step == self.cfg.train.total_steps
        if self.rank == 0 and (step % self.cfg.train.sync_interval == 0 or last):
            publish_s = self.publish(step)
        interval, state_s = self.cfg.train.state_interval, 0.0
        if interval and step % interval == 0 and not last:
            t_state = time.monotonic()
            self.save_state(step)
            state_s = time.monotonic() - t_state
        row: dict[str, Any] = {
            "step": step,
            "sampler_id": batch.sampler_id,
            "batch_seq": batch.seq,
            "policy_version": batch.policy_version,
            "staleness": (step - 1) - batch.policy_version,
            "optimizer_steps": self.cfg.train.ppo_epochs
            * len(mine.episodes)
            // mini_batch_seqs(self.cfg, self.world),
            "published_version": self.version,
            "duplicates_dropped": self.duplicates_dropped,
            "rejected_frames": self.channel.rejected_frames if self.channel else 0,
            "rejected_batches": self.rejected_batches,
            **{f"{engine}_steps_skipped": n for engine, n in skipped.items()},
        }
        row.update(batch_metrics(batch))
        row.update({"rollout_kl_to_ref": rollout_kl, "kl_reward_coef": kl_coef_used})
        row.update(correction_metrics)
        row.update(train_metrics)
        row.update(
            {
                "recv_s": recv_s,
                "score_s": score_s,
                "train_s": train_s,
                "trainer_tokens_per_s": trained_tokens / max(train_s, 1e-9),
                "trainer_peak_mem_gib": peak_mem,
                "publish_s": publish_s,
                "state_s": state_s,
                "rank_group_ids": groups,
                "time": time.time(),  # when the step ended: steps per hour between any two rows
            }
        )
        return row

    def open_run_dir(self) -> None:
        """Rank 0: a new run moves the previous one aside; a resumed one drops what the crashed
        run did after its last saved state and republishes the resumed weights."""
        if self.start_step == 0:
            rotate_run_dir(self.run_dir)
            save_config(self.cfg, self.run_dir / "config.yaml")
            return
        dropped = train_state.truncate_metrics(self.run_dir / METRICS_FILE, self.start_step)
        discarded = discard_versions_after(self.run_dir, self.start_step)
        log.info(
            "resuming after step %d: dropped %d metric rows and versions %s of the crashed run",
            self.start_step,
            dropped,
            discarded or "none",
        )
        self.publish(self.start_step)  # the sampler follows the trainer back to these weights

    def run(self) -> None:
        cfg = self.cfg
        if self.rank == 0:
            # First: a busy port moves nothing. A resumed trainer announces its own version
            # and acknowledgements from its very first heartbeat.
            self.channel = TrainerChannel(cfg.transport, self.version, self.ledger, self.run_dir)
            self.open_run_dir()
            log.info(
                "trainer: %d rank(s), listening on %s", self.world, cfg.transport.episodes_addr
            )
        from tqdm import tqdm

        bar = tqdm(
            total=cfg.train.total_steps,
            initial=self.start_step,
            desc="train",
            disable=self.rank != 0,
        )
        try:
            for step in range(self.start_step + 1, cfg.train.total_steps + 1):
                batch, recv_s = self.receive()
                batch = broadcast_batch(batch, self.rank, cfg.transport.max_frame_bytes)
                if batch is None:
                    raise PeerError("rank 0 ended the run")
                row = self.step(step, batch, recv_s)
                if self.rank == 0:
                    append_jsonl(self.run_dir / METRICS_FILE, row)
                    bar.set_postfix(
                        reward=f"{row['reward_mean']:.3f}",
                        kl=f"{row.get('kl', 0.0):.4f}",
                        acc=f"{row['accuracy']:.2f}",
                    )
                    bar.update()
            if self.start_step < cfg.train.total_steps:
                self.save_state(cfg.train.total_steps)
            if self.channel is not None:
                self.channel.announce(messages.DONE, version=self.version)
                if cfg.transport.weights_addr:
                    self.channel.wait_for_byes()
        except BaseException as e:
            if self.rank == 0 and self.channel is not None:
                failure = collective_failure(e, self.rank, collective_timeout_s(cfg))
                reason = (
                    messages.INTERRUPTED if isinstance(e, KeyboardInterrupt) else failure or str(e)
                )
                self.channel.announce(messages.STOP, reason=reason, version=self.version)
            raise
        finally:
            bar.close()
            if self.channel is not None:
                self.channel.close()
        if self.rank == 0:
            plot = plot_run(self.run_dir)
            samplers = per_sampler(read_jsonl(self.run_dir / METRICS_FILE))
            write_atomic(self.run_dir / SAMPLERS_FILE, json.dumps(samplers, indent=1) + "\n")
            for sid, n in samplers.items():
                log.info(
                    "%s: %d batches, reward %.3f, accuracy %.3f, %.0f tokens/s, staleness <= %d",
                    sid, n["batches"], n["reward_mean"], n["accuracy"], n["gen_tokens_per_s"],
                    n["staleness_max"],
                )  # fmt: skip
            print(
                f"\nrun finished: {cfg.train.total_steps} steps, final version {self.version}\n"
                f"  metrics:     {self.run_dir / METRICS_FILE}\n"
                f"  checkpoints: {self.run_dir / 'versions'} (weights), "
                f"{self.run_dir / 'train_state'} (optimizer, step)\n"
                f"  plot:        {plot}",
                flush=True,
            )


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_trainer(cfg: Config) -> int:
    import deepspeed

    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout_s = collective_timeout_s(cfg)
    deepspeed.init_distributed(dist_backend=backend, timeout=timedelta(seconds=timeout_s))
    try:
        Trainer(cfg).run()
        return 0
    except KeyboardInterrupt:
        log.error("trainer stopping: interrupted")
        return 130
    except PeerError as e:
        log.error("trainer stopping: %s", e)
        return 1
    except RuntimeError as e:
        failure = collective_failure(e, dist.get_rank(), timeout_s)
        if failure is None:
            raise
        log.error("trainer stopping: %s", failure)
        return 1
    finally:
        dist.destroy_process_group()
