"""Values that are well-typed but unusable are refused here, each with one line naming the key
and how to fix it (types and unknown keys are grpo.config.loading's job)."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo.config.algo import check_correction
from grpo.config.data import check_mixture, check_rows
from grpo.config.engines import abilities
from grpo.config.errors import ConfigError
from grpo.config.rules import check_continuous, check_teacher
from grpo.config.weights import check_weights
from grpo.core.names import SAMPLER_ID_RULE, is_sampler_id
from grpo.core.vocabulary import GAE

if TYPE_CHECKING:
    from grpo.config.sampling import RolloutConfig
    from grpo.config.sections import Config, TransportConfig


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
        ("transport.peer_timeout_s", cfg.transport.peer_timeout_s),
        ("transport.startup_timeout_s", cfg.transport.startup_timeout_s),
        ("eval.max_new_tokens", cfg.eval.max_new_tokens),
        ("data.max_prompt_tokens", cfg.data.max_prompt_tokens),
    ]


def check_values(cfg: Config) -> None:
    """Reject values that are well-typed but unusable, saying how to fix them."""
    _check_signs(cfg)
    _check_rollout(cfg)
    _check_eval(cfg)
    _check_algo(cfg)
    _check_train(cfg)
    _check_delivery(cfg)
    _check_transport(cfg.transport)
    check_weights(cfg)
    _check_devices(cfg)
    _check_reward(cfg)
    _check_deepspeed(cfg.train.deepspeed_config)
    if cfg.data.reward and ":" not in cfg.data.reward:
        raise ConfigError(
            f"data.reward must look like 'package.module:function', got {cfg.data.reward!r}"
        )
    check_rows(cfg.rows)
    check_teacher(cfg)
    d = cfg.data
    check_mixture(d.mixture, d.task, d.train, d.test, d.reward)


def _check_signs(cfg: Config) -> None:
    for key, value in _positive(cfg):
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value!r}")
    for key, value in (
        ("train.max_staleness", cfg.train.max_staleness),
        ("train.max_tokens_per_micro_batch", cfg.train.max_tokens_per_micro_batch),
        ("train.state_interval", cfg.train.state_interval),
        ("eval.interval", cfg.eval.interval),
        ("eval.num_questions", cfg.eval.num_questions),
        ("eval.samples", cfg.eval.samples),
        ("algo.overlong_factor", cfg.algo.overlong_factor),
        ("train.weight_decay", cfg.train.weight_decay),
        ("algo.kl_loss_coef", cfg.algo.kl_loss_coef),
        ("algo.entropy_coef", cfg.algo.entropy_coef),
    ):
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value!r}")


def _check_algo(cfg: Config) -> None:
    algo = cfg.algo
    for key in ("clip_low", "clip_high"):
        value = getattr(algo, key)
        if value is not None and not 0 <= value < 1:
            raise ConfigError(f"algo.{key} must be in [0, 1) or null, got {value!r}")
    if algo.clip_c is not None and algo.clip_c <= 1:
        raise ConfigError(f"algo.clip_c must be > 1 or null, got {algo.clip_c!r}")
    if not 0 <= algo.overlong_buffer <= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algo.overlong_buffer must be in [0, rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens}], got {algo.overlong_buffer}"
        )
    if not 0 < algo.gamma <= 1 or not 0 <= algo.lam <= 1:
        raise ConfigError(
            f"algo.gamma must be in (0, 1] and algo.lam in [0, 1], got {algo.gamma!r}, {algo.lam!r}"
        )
    if algo.kl_reward_coef < 0 or algo.kl_target <= 0 or algo.kl_horizon <= 0:
        raise ConfigError("algo.kl_reward_coef must be >= 0, kl_target and kl_horizon > 0")
    if algo.kl_ctrl == "adaptive" and not (algo.kl_in_reward and algo.kl_reward_coef):
        raise ConfigError(
            "algo.kl_ctrl=adaptive adapts the in-reward KL coefficient: it needs "
            "algo.kl_in_reward=true and algo.kl_reward_coef > 0"
        )
    critic = cfg.critic
    if critic.lr <= 0 or critic.value_clip <= 0 or critic.warmup_steps < 0:
        raise ConfigError("critic.lr and critic.value_clip must be > 0, warmup_steps >= 0")
    if algo.advantage == GAE and critic.warmup_steps >= cfg.train.total_steps:
        raise ConfigError(
            f"critic.warmup_steps ({critic.warmup_steps}) >= train.total_steps "
            f"({cfg.train.total_steps}): the policy would never train"
        )


def _check_train(cfg: Config) -> None:
    t = cfg.train
    if t.max_grad_norm <= 0:
        raise ConfigError(f"train.max_grad_norm must be > 0, got {t.max_grad_norm!r}")
    if t.lr_warmup_steps < 0 or not 0.0 <= t.lr_min_ratio <= 1.0:
        raise ConfigError(
            "train.lr_warmup_steps must be >= 0 and train.lr_min_ratio in [0, 1], got "
            f"{t.lr_warmup_steps} and {t.lr_min_ratio}"
        )
    # The sampler loads the newest announced version while the trainer may publish up to
    # max_staleness + 1 more; the one being loaded must not be pruned meanwhile.
    needed = t.max_staleness // t.sync_interval + 2
    if t.keep_versions < needed:
        raise ConfigError(
            f"train.keep_versions must be >= {needed} with max_staleness "
            f"{t.max_staleness} and sync_interval {t.sync_interval}, got "
            f"{t.keep_versions}: a version could be deleted while the sampler loads it"
        )
    batch_seqs = cfg.rollout.questions_per_step * cfg.rollout.group_size
    mini = t.mini_batch_size
    if mini and (mini < 0 or batch_seqs % mini or mini % cfg.world):
        raise ConfigError(
            f"train.mini_batch_size ({mini}) must divide the batch ({batch_seqs} sequences) and "
            f"be a multiple of the trainer's ranks ({cfg.world}); 0 = the whole batch"
        )
    if cfg.rollout.questions_per_step % cfg.world:
        raise ConfigError(
            f"rollout.questions_per_step ({cfg.rollout.questions_per_step}) must be a multiple "
            f"of the trainer's ranks, train.nnodes x train.num_ranks ({cfg.world}): each rank "
            "trains on whole groups"
        )


def _check_eval(cfg: Config) -> None:
    e = cfg.eval
    if e.k and not e.samples:
        raise ConfigError("eval.k needs eval.samples > 0 (answers sampled per question)")
    bad = [k for k in e.k if not 1 <= k <= e.samples]
    if bad:
        raise ConfigError(f"eval.k must be between 1 and eval.samples ({e.samples}), got {bad}")


def _check_rollout(cfg: Config) -> None:
    r, v = cfg.rollout, cfg.rollout.vllm
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p!r}")
    if r.group_size < 2:
        raise ConfigError(
            "rollout.group_size must be >= 2: group-normalised advantages need several answers"
        )
    if r.top_k < 0 or v.max_model_len < 0 or v.kv_cache_gib < 0:
        raise ConfigError("rollout.top_k, rollout.vllm.max_model_len and kv_cache_gib must be >= 0")
    if v.tensor_parallel_size < 1 or not 0 < v.gpu_memory_utilization <= 1:
        raise ConfigError(
            "rollout.vllm.tensor_parallel_size must be >= 1 and gpu_memory_utilization in (0, 1]"
        )
    if any(not s for s in r.stop):
        raise ConfigError("rollout.stop holds an empty string, which would end every answer")
    if not is_sampler_id(r.sampler_id):
        raise ConfigError(f"rollout.sampler_id must be {SAMPLER_ID_RULE}, got {r.sampler_id!r:.80}")
    _check_turns(r)
    check_continuous(cfg)
    # Continuous generation records every token's log-prob, whichever engine samples it.
    logprobs = abilities(r.backend).reports_logprobs or r.mode == "continuous"
    check_correction(cfg.algo, engine_logprobs=logprobs)


def _check_reward(cfg: Config) -> None:
    r = cfg.reward
    # Finite (as every float key, grpo.config.loading): an infinite limit is no limit, and one
    # hung reward would stall the run again.
    if r.timeout_s <= 0:
        raise ConfigError(f"reward.timeout_s must be a finite number > 0, got {r.timeout_s!r}")
    if r.workers < 1:
        raise ConfigError(f"reward.workers must be >= 1, got {r.workers!r}")
    if r.service_timeout_s <= 0:
        raise ConfigError(
            f"reward.service_timeout_s must be a finite number > 0, got {r.service_timeout_s!r}"
        )
    if r.service_retries < 0 or r.service_batch < 1:
        raise ConfigError("reward.service_retries must be >= 0 and reward.service_batch >= 1")
    if not 0.0 <= r.max_error_rate <= 1.0:
        raise ConfigError(f"reward.max_error_rate must be in [0, 1], got {r.max_error_rate!r}")
    t = cfg.transport
    if r.service_addr and r.service_addr in (t.episodes_addr, t.control_addr, t.weights_addr):
        raise ConfigError(f"reward.service_addr {r.service_addr} is a transport.* address too")
    s = cfg.reward_server
    if s.backend in ("classifier", "judge") and not s.model:
        raise ConfigError(f"reward_server.backend={s.backend} needs reward_server.model")
    if len(s.score_range) != 2 or not s.score_range[0] < s.score_range[1]:
        raise ConfigError(f"reward_server.score_range must be [low, high], got {s.score_range}")
    if min(s.batch_size, s.max_batch, s.max_new_tokens, s.max_tokens) < 1 or s.batch_wait_ms < 0:
        raise ConfigError(
            "reward_server.batch_size, max_batch, max_new_tokens and max_tokens must be >= 1, "
            "batch_wait_ms >= 0"
        )
    problem = judge_template_problem(s.template) if s.template else None
    if problem:
        raise ConfigError(f"reward_server.template: {problem}")


JUDGE_FIELDS = ("prompt", "answer", "reference")


def judge_template_problem(template: str) -> str | None:
    """Why `template` cannot be the judge's instruction, or None. The judge fills it with
    ``str.format(prompt=..., answer=..., reference=...)`` (grpo.reward_service.backends), so it
    may name those three and nothing else; a literal brace is written twice."""
    literal = "write a literal brace twice, as in \\boxed{{}}"
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        return f"{e}; {literal}"
    for name in names:
        if name not in JUDGE_FIELDS:
            return (
                f"'{{{name}}}' is not a placeholder: it may hold {{prompt}}, {{answer}} and "
                f"{{reference}}; {literal}"
            )
    if "answer" not in names:
        return "it has no {answer}: the judge would never see the answer"
    try:
        template.format(**dict.fromkeys(JUDGE_FIELDS, ""))
    except (ValueError, KeyError, IndexError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _check_turns(r: RolloutConfig) -> None:
    if r.max_turns < 1 or r.max_turn_tokens < 0:
        raise ConfigError(
            f"rollout.max_turns must be >= 1 and rollout.max_turn_tokens >= 0, got "
            f"{r.max_turns} and {r.max_turn_tokens}"
        )
    if r.max_turns > 1 and not r.tools:
        raise ConfigError(
            f"rollout.max_turns={r.max_turns} needs a tool to call between turns: set "
            "rollout.tools (e.g. [calculator]), or max_turns 1"
        )
    if r.max_turns == 1 and r.tools:
        raise ConfigError(
            f"rollout.tools {r.tools} are called only between turns: set rollout.max_turns > 1, "
            "or tools []"
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


# What save_pretrained's max_shard_size accepts: a whole number and a unit.
_SHARD_SIZE = re.compile(r"\d+[GMK]i?B", re.IGNORECASE)


def _check_delivery(cfg: Config) -> None:
    r, t = cfg.rollout, cfg.train
    if not _SHARD_SIZE.fullmatch(t.max_shard_size):
        raise ConfigError(
            f"train.max_shard_size must be a size such as 5GB or 500MB, got {t.max_shard_size!r}"
        )
    if not 0 <= r.sampler_index < r.num_samplers:
        raise ConfigError(
            f"rollout.sampler_index must be in [0, rollout.num_samplers={r.num_samplers}), "
            f"got {r.sampler_index}"
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
    if t.stall_timeout_s and t.stall_timeout_s < 2 * t.heartbeat_s:
        raise ConfigError(
            f"transport.stall_timeout_s ({t.stall_timeout_s}) must be 0 (never) or at least "
            f"twice transport.heartbeat_s ({t.heartbeat_s}): heartbeats carry the progress"
        )
    addrs = [a for a in (t.episodes_addr, t.control_addr, t.weights_addr) if a]
    if len(set(addrs)) < len(addrs):
        raise ConfigError("transport.episodes_addr, control_addr and weights_addr must differ")
    if t.max_frame_bytes < 1 << 20:
        raise ConfigError(f"transport.max_frame_bytes must be >= 1 MiB, got {t.max_frame_bytes}")
    if t.receive_hwm < 0:
        raise ConfigError(f"transport.receive_hwm must be >= 0 (0 = derived), got {t.receive_hwm}")
    if t.max_version_bytes < 1:
        raise ConfigError(f"transport.max_version_bytes must be >= 1, got {t.max_version_bytes}")


def _check_deepspeed(path: str) -> None:
    """The ZeRO settings of train.deepspeed_config that the trainer supports. A missing file
    is left to the trainer, which reports it: a sampler's node need not have it."""
    try:
        ds = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return
    except OSError as e:  # a directory, a device, no permission
        raise ConfigError(f"train.deepspeed_config: cannot read {path!r} ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"train.deepspeed_config: {path} is not valid JSON ({e})") from None
    where = f"train.deepspeed_config {path}"
    zero = ds.get("zero_optimization", {}) if isinstance(ds, dict) else None
    if not isinstance(zero, dict):
        raise ConfigError(f"{where}: expected a JSON object with a zero_optimization object")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    offloads = set()
    for kind in ("offload_optimizer", "offload_param"):
        section = zero.get(kind) or {}
        device = section.get("device", "none") if isinstance(section, dict) else section
        if device not in ("none", "cpu"):
            raise ConfigError(
                f"{where}: zero_optimization.{kind}.device {device!r} is not supported (NVMe "
                "offload is untested here): use cpu or none"
            )
        if device == "cpu":
            offloads.add(kind)
    if "offload_param" in offloads and stage != 3:
        raise ConfigError(
            f"{where}: zero_optimization.offload_param needs stage 3 (stage {stage} keeps the "
            "whole parameters on every rank and DeepSpeed would ignore it): use "
            "configs/deepspeed/zero3_offload.json, or drop offload_param"
        )
    if "offload_optimizer" in offloads and stage == 0:
        raise ConfigError(
            f"{where}: zero_optimization.offload_optimizer needs stage 1, 2 or 3: use "
            "configs/deepspeed/zero2_offload.json"
        )
