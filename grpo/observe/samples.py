"""Answers to read: a few of each step's answers, as text, in `samples.jsonl` beside the metrics
(and as text in TensorBoard and W&B), and `python -m grpo samples RUN_DIR` to print the newest.

A reward number says how well the model did, not what it said; people read the answers first
(TRL and verl log them too). Each step keeps `logging.samples_per_step` answers chosen by reward,
the best first and the worst last, the rest evenly between: what the reward likes and what it
does not, side by side. Each evaluation keeps as many greedy answers, to its first questions
(`sampler_id` "eval": the same questions at every version, to compare).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from grpo.core.episode import EpisodeBatch
from grpo.observe.metrics import EVAL_FILE, METRICS_FILE, read_jsonl

SAMPLES_FILE = "samples.jsonl"
EVAL = "eval"  # the sampler_id of an evaluation's answers
SAMPLES_KEY = "_samples"  # an eval row's answers: RunLog.eval writes them here, not to eval.jsonl
ANSWERS_KEY = "_answers"  # an eval row's greedy answers, all of them: for RunLog's Watch


def by_reward(rewards: np.ndarray, n: int) -> list[int]:
    """Indices of `n` answers: the best, the worst and the rest evenly between in reward order
    (ties in the batch's order); all of them when the batch has no more than `n`."""
    order = np.argsort(-rewards, kind="stable")
    if n <= 0:
        return []
    if len(order) <= n:
        return order.tolist()
    picks = np.round(np.linspace(0, len(order) - 1, n)).astype(int)
    return order[picks].tolist()


def sample_rows(batch: EpisodeBatch, step: int, decode: Any, n: int) -> list[dict[str, Any]]:
    """`n` rows of `batch`'s answers (see `by_reward`) with their prompt and answer as text;
    `decode(ids) -> str` is the tokenizer's."""
    c = batch.columns
    rows = []
    for i in by_reward(np.asarray(c.reward), n):
        episode = batch.episodes[i]
        rows.append(
            {
                "step": step,
                "version": batch.policy_version,
                "sampler_id": batch.sampler_id,
                "group_id": int(episode.group_id),
                "reward": float(episode.reward),
                "reward_info": episode.reward_info,
                "finish_reason": episode.finish_reason,
                "prompt": decode(episode.prompt_ids.tolist()),
                "answer": decode(episode.completion_ids.tolist()),
            }
        )
    return rows


def eval_rows(results: list[Any], version: int, prompts: list[Any], decode: Any) -> list[dict]:
    """Evaluation answers (grpo.eval.questions.QuestionResult, greedy) as samples.jsonl rows:
    `step` is the version evaluated, `sampler_id` "eval", `group_id` the question's index."""
    return [
        {
            "step": version,
            "version": version,
            "sampler_id": EVAL,
            "group_id": r.index,
            "reward": r.reward,
            "reward_info": {
                k: v
                for k, v in (("correct", r.greedy_correct), ("formatted", r.greedy_formatted))
                if v is not None
            },
            "finish_reason": r.finish_reason,
            "prompt": decode(list(prompts[r.index].ids)),
            "answer": r.answer,
        }
        for r in results
    ]


def _heading(row: dict[str, Any]) -> str:
    parts = ", ".join(f"{k}={v}" for k, v in row["reward_info"].items()) or "no parts"
    # What the degeneration measures saw in it (grpo.observe.degeneration.flags).
    flagged = "".join(f" [{f}]" for f in row.get("flags", []))
    return (
        f"step {row['step']}: reward {row['reward']:.3f}{flagged} ({parts}; "
        f"{row['finish_reason']}, version {row['version']}, {row['sampler_id']}, group "
        f"{row['group_id']})"
    )


def as_markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as one text for a tracker (TensorBoard renders markdown; indented: verbatim)."""
    return "\n\n---\n\n".join(
        f"**{_heading(r)}**\n\n" + "\n\n".join(_indented(r[k]) for k in ("prompt", "answer"))
        for r in rows
    )


def _indented(text: str) -> str:
    return "    " + text.replace("\n", "\n    ")


def show(rows: list[dict[str, Any]]) -> str:
    """The rows as a terminal reads them."""
    return "\n".join(
        f"== {_heading(r)}\n-- prompt:\n{r['prompt']}\n-- answer:\n{r['answer']}\n" for r in rows
    )


def main(argv: list[str]) -> int:
    """`python -m grpo samples RUN_DIR [-n N] [--step S]`: the newest answers a run wrote."""
    parser = argparse.ArgumentParser(prog="python -m grpo samples", description=main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("-n", type=int, default=4, help="how many (the newest; default 4)")
    parser.add_argument("--step", type=int, help="only this step's")
    args = parser.parse_args(argv)
    path = args.run_dir / SAMPLES_FILE
    if not path.is_file():
        print(
            f"samples: no {SAMPLES_FILE} in {args.run_dir} (logging.samples_per_step: 0, or "
            "no step trained yet)",
            file=sys.stderr,
        )
        return 2
    rows = read_jsonl(path)
    if args.step is not None:
        rows = [r for r in rows if r.get("step") == args.step]
    print(alarms(args.run_dir) + show(rows[-args.n :] if args.n > 0 else rows))
    return 0


def alarms(run_dir: Path, last: int = 5) -> str:
    """The newest steps and evaluations whose answers set off the degeneration alarm
    (grpo.observe.degeneration), a line each, as a heading; '' when none did."""
    steps = [(f"step {r['step']}", r) for r in read_jsonl(run_dir / METRICS_FILE)]
    evals = [(f"eval v{r['version']}", r) for r in read_jsonl(run_dir / EVAL_FILE)]
    said = [
        f"  {where}: {', '.join(r['degen_alarms'])}"
        for where, r in steps + evals
        if r.get("degen_alarms")
    ]
    if not said:
        return ""
    return "degeneration alarms (reward hacking?), newest:\n" + "\n".join(said[-last:]) + "\n\n"
