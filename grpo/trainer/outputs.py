"""What the trainer writes besides weights: the run dir itself and one metrics row per step."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from grpo.config import Config, save_config
from grpo.core.durable import write_atomic
from grpo.core.episode import EpisodeBatch
from grpo.eval.significance import accuracy_change
from grpo.observe.metrics import (
    EVAL_FILE,
    METRICS_FILE,
    SAMPLERS_FILE,
    info_rates,
    mean,
    per_sampler,
    plot_run,
    read_jsonl,
)
from grpo.observe.samples import SAMPLES_FILE
from grpo.tasks.runner import TIMEOUT
from grpo.trainer.schedule import steps_per_batch
from grpo.trainer.state import truncate_metrics
from grpo.weights.dirs import discard_versions_after, version_dir

log = logging.getLogger("grpo.trainer")
FINAL = "final"


def rotate_run_dir(run_dir: Path) -> None:
    """A new run never mixes with an old one, and never deletes one: the previous run of the
    same name moves to <name>.1, the one before that already there to <name>.2, ... (the
    highest number is the oldest)."""
    if run_dir.exists() and any(run_dir.iterdir()):
        taken = [
            int(p.name.rsplit(".", 1)[1])
            for p in run_dir.parent.glob(f"{run_dir.name}.*")
            if p.name.rsplit(".", 1)[1].isdigit()
        ]
        for n in sorted(taken, reverse=True):  # shift the older ones up, newest last
            os.replace(
                run_dir.with_name(f"{run_dir.name}.{n}"),
                run_dir.with_name(f"{run_dir.name}.{n + 1}"),
            )
        kept = run_dir.with_name(f"{run_dir.name}.1")
        os.replace(run_dir, kept)
        log.info("previous run moved to %s", kept)
    run_dir.mkdir(parents=True, exist_ok=True)


def link_final(run_dir: Path, version: int) -> Path:
    """`<run dir>/final`: the run's last version, loadable as it is (from_pretrained), whatever
    its number. A symbolic link, replaced atomically."""
    final, tmp = run_dir / FINAL, run_dir / f".{FINAL}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version_dir(run_dir, version).relative_to(run_dir), target_is_directory=True)
    os.replace(tmp, final)
    return final


def open_run_dir(cfg: Config, start_step: int) -> None:
    """Rank 0: a new run moves the previous one aside; a resumed one drops what the crashed
    run did after its last saved state (the trainer then republishes the resumed weights)."""
    run_dir = cfg.run_dir
    if start_step == 0:
        rotate_run_dir(run_dir)
        save_config(cfg, run_dir / "config.yaml")
        return
    dropped = truncate_metrics(run_dir / METRICS_FILE, start_step)
    truncate_metrics(run_dir / SAMPLES_FILE, start_step)
    truncate_metrics(run_dir / EVAL_FILE, start_step, key="version")
    discarded = discard_versions_after(run_dir, start_step)
    log.info(
        "resuming after step %d: dropped %d metric rows and versions %s of the crashed run",
        start_step,
        dropped,
        discarded or "none",
    )


def batch_metrics(batch: EpisodeBatch) -> dict[str, Any]:
    """Sampler-side numbers of the whole batch: reward, accuracy, format, lengths, timings.

    The per-episode prompt and completion lengths are kept too (bench/padding.py replays them)."""
    c = batch.columns
    infos = list(c.reward_info)
    row = {
        "reward_mean": float(c.reward.mean()),
        "reward_std": float(c.reward.std(ddof=1)) if len(c) > 1 else 0.0,
        "flat_groups_frac": flat_group_share(c.reward, batch.group_size),
        **info_rates(infos, c.reward.tolist()),
        "reward_errors": sum("reward_error" in i for i in infos),
        # Of those, the calls stopped waiting for at reward.timeout_s (grpo.tasks.runner).
        "reward_timeouts": sum(i.get("reward_error") == TIMEOUT for i in infos),
        "response_len_mean": float(c.completion_len.mean()),
        "truncated_frac": mean([float(r == "length") for r in c.finish_reason]),
        "prompt_lens": c.prompt_len.tolist(),
        "completion_lens": c.completion_len.tolist(),
    }
    # With the reward service: the two parts of the reward (grpo.reward_service.client.combine).
    for part in ("rule_reward", "model_reward"):
        values = [i[part] for i in infos if isinstance(i.get(part), (int, float))]
        if values:
            row[f"{part}_mean"] = mean(values)
    row.update(tool_metrics(infos))
    if c.loss_mask is not None and c.loss_mask.size:  # the share of tokens no loss reads
        row["tool_token_frac"] = 1.0 - float(c.loss_mask.mean())
    row.update({f"sampler_{k}": v for k, v in batch.stats.items()})
    return row


def flat_group_share(rewards: np.ndarray, group_size: int) -> float:
    """The share of groups (contiguous, `group_size` answers each) whose answers all scored the
    same: they teach GRPO nothing (TRL's frac_reward_zero_std). Reported whatever the sampler
    did with them; `sampler_flat_groups_*` count only dynamic sampling's."""
    groups = np.asarray(rewards).reshape(-1, group_size)
    return float((groups.max(axis=1) == groups.min(axis=1)).mean())


def tool_metrics(infos: list[dict[str, Any]]) -> dict[str, float]:
    """Mean turns, tool calls and tool errors per answer of a multi-turn batch (its reward
    infos carry them: grpo.rollout.multi_turn.tool_info); nothing for a single-turn one."""
    if not any("turns" in i for i in infos):
        return {}
    return {
        f"{key}_mean": mean([float(i.get(key, 0)) for i in infos])
        for key in ("turns", "tool_calls", "tool_errors")
    }


def step_row(
    step: int,
    batch: EpisodeBatch,
    cfg: Config,
    world: int,
    *,
    counters: dict[str, Any],
    numbers: dict[str, Any],
    seconds: dict[str, float],
    peak_mem_gib: float,
    rank_group_ids: list[list[int]],
) -> dict[str, Any]:
    """The metrics row of one step (docs/outputs.md lists the keys): which batch, the
    trainer's counters, the batch's own numbers, the update's, and where the time went.
    A number that was not computed this step is absent, never NaN."""
    c = batch.columns  # the ranks train their shares at once: the batch's tokens / train_s
    trained_tokens = cfg.train.ppo_epochs * int(c.prompt_len.sum() + c.completion_len.sum())
    return {
        "step": step,
        "sampler_id": batch.sampler_id,
        "batch_seq": batch.seq,
        "policy_version": batch.policy_version,
        "staleness": (step - 1) - batch.policy_version,
        "optimizer_steps": steps_per_batch(cfg, world),
        **counters,
        **batch_metrics(batch),
        **numbers,
        **seconds,
        "trainer_tokens_per_s": trained_tokens / max(seconds["train_s"], 1e-9),
        "trainer_peak_mem_gib": peak_mem_gib,
        "rank_group_ids": rank_group_ids,
        "time": time.time(),  # when the step ended: steps per hour between any two rows
    }


def reward_failures(rows: list[dict]) -> str:
    """What the closing summary says of the reward's failures over the run's metrics rows."""
    answers = sum(len(r.get("completion_lens", ())) for r in rows)
    errors, timeouts = (
        sum(int(r.get(k, 0)) for r in rows) for k in ("reward_errors", "reward_timeouts")
    )
    return f"{errors} errors ({timeouts} of them timeouts) in {answers} answers"


def held_out_change(run_dir: Path) -> str:
    """The summary's line on the held-out evaluation: the first and last evaluated versions'
    accuracies with the p-value of the change, per prompt set; "" without two evaluations."""
    rows = [r for r in read_jsonl(run_dir / EVAL_FILE) if "version" in r]
    if len(rows) < 2:
        return ""
    first, last = rows[0], rows[-1]
    phrases = accuracy_change(first, last)
    if not phrases:
        return ""
    return f"  held out:    v{first['version']} -> v{last['version']}: " + "; ".join(phrases) + "\n"


def summarise_run(run_dir: Path, steps: int, version: int) -> None:
    """At the end of a run: the plot, the per-sampler summary (log and samplers.json), and
    where everything went, as absolute paths (the user's shell may be anywhere), named for what
    the run made: a model, or a LoRA adapter (peft's adapter_config.json), which merge-lora
    turns into one."""
    run_dir = run_dir.resolve()
    plot = plot_run(run_dir)
    final = link_final(run_dir, version)
    rows = read_jsonl(run_dir / METRICS_FILE)
    samplers = per_sampler(rows)
    write_atomic(run_dir / SAMPLERS_FILE, json.dumps(samplers, indent=1) + "\n")
    for sid, n in samplers.items():
        accuracy = f", accuracy {n['accuracy']:.3f}" if "accuracy" in n else ""
        log.info(
            "%s: %d batches, reward %.3f%s, %.0f tokens/s, staleness <= %d",
            sid,
            n["batches"],
            n["reward_mean"],
            accuracy,
            n["gen_tokens_per_s"],
            n["staleness_max"],
        )
    # The tools as this interpreter runs them (the run's venv): a bare `python` or `grpo` from
    # the user's own shell is rarely the project's.
    grpo = f"{sys.executable} -m grpo"
    made = f"final model: {final} (-> versions/v{version:06d})"
    if (final / "adapter_config.json").is_file():  # not a model: say how to get one
        made = (
            f"final adapter: {final} (-> versions/v{version:06d}); a model of it: {grpo} "
            f"merge-lora {final} {run_dir / 'merged'}"
        )
    print(
        f"\nrun finished: {steps} steps, final version {version}\n"
        f"  metrics:     {run_dir / METRICS_FILE}\n"
        f"  rewards:     {reward_failures(rows)}\n"
        f"{held_out_change(run_dir)}"
        f"  {made}\n"
        f"  checkpoints: {run_dir / 'versions'} (weights), "
        f"{run_dir / 'train_state'} (optimizer, step)\n"
        f"  answers:     {grpo} samples {run_dir}\n"
        f"  plot:        {plot}",
        flush=True,
    )
