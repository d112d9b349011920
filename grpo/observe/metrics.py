"""Run metrics: the trainer's JSONL rows (one per step, one per evaluation) and the plot."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
PLOT_FILE = "plot.png"
SAMPLERS_FILE = "samplers.json"  # per-sampler summary, written by the trainer at the end


def peak_memory_gib() -> float:
    """This process's peak memory in GiB: allocated on its GPU when it has one (what limits
    a GPU role), else its peak resident set on the CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """One line per call, flushed, so a crash loses at most the row being written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")
        f.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a killed process
    return rows


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# The reward info key naming an answer's dataset (grpo.tasks.mixture.INFO_KEY; verl's word).
SOURCE_INFO = "data_source"


def info_rates(infos: list[dict[str, Any]], rewards: list[float] | None = None) -> dict[str, float]:
    """Accuracy and format rate from reward infos (their `correct` and `formatted` keys), and
    per dataset when the infos name theirs (source_rates). A rate no info reports (a reward
    that returns a bare number) is left out, not shown as 0."""
    rates = {
        name: mean([float(bool(i.get(key))) for i in infos])
        for name, key in (("accuracy", "correct"), ("format_rate", "formatted"))
        if any(key in i for i in infos)
    }
    return rates | source_rates(infos, rewards)


def source_rates(
    infos: list[dict[str, Any]], rewards: list[float] | None = None
) -> dict[str, float]:
    """Per dataset of a mixture (the `data_source` its reward info names): accuracy/<name>,
    format_rate/<name>, source_frac/<name> (its share of the answers) and, given the answers'
    rewards, reward_mean/<name>. Nothing when no info names a dataset."""
    names = sorted({str(i[SOURCE_INFO]) for i in infos if SOURCE_INFO in i})
    row: dict[str, float] = {}
    for name in names:
        mine = [k for k, i in enumerate(infos) if str(i.get(SOURCE_INFO)) == name]
        row[f"accuracy/{name}"] = mean([float(bool(infos[k].get("correct"))) for k in mine])
        row[f"format_rate/{name}"] = mean([float(bool(infos[k].get("formatted"))) for k in mine])
        row[f"source_frac/{name}"] = len(mine) / len(infos)
        if rewards is not None:
            row[f"reward_mean/{name}"] = mean([float(rewards[k]) for k in mine])
    return row


def per_sampler(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each sampler's share of a run: batches, mean reward, accuracy, generation speed. A
    number some rows lack (a sampler's own stats: a batch need not carry them) is the mean
    of the rows that have it, NaN if none does: the run's end never fails on a missing key."""
    out: dict[str, dict[str, float]] = {}
    for sid in sorted({str(r.get("sampler_id")) for r in rows}):
        mine = [r for r in rows if str(r.get("sampler_id")) == sid]
        staleness = [r["staleness"] for r in mine if "staleness" in r]
        out[sid] = {
            "batches": len(mine),
            "reward_mean": mean(_present(mine, "reward_mean")),
            **({"accuracy": mean(accuracy)} if (accuracy := _present(mine, "accuracy")) else {}),
            "gen_tokens_per_s": mean(_present(mine, "sampler_gen_tokens_per_s")),
            "staleness_max": max(staleness, default=0),
        }
    return out


def _present(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float))]


def series(rows: list[dict[str, Any]], key: str, x: str = "step") -> tuple[list, list]:
    """(x, y) of the rows that have `key`: a metric not computed at some step (the policy's
    during a critic warm-up, say) is left out of its row, not written as NaN."""
    kept = [r for r in rows if key in r]
    return [r[x] for r in kept], [r[key] for r in kept]


# The degeneration measures drawn (grpo.observe.degeneration), and their labels.
_DEGENERATION = (
    ("degenerate_frac", "degenerate"),
    ("degen_repeat_frac", "repeats"),
    ("degen_multi_marker_frac", "several markers"),
    ("degen_length_ratio", "length / first steps"),
    ("degen_entropy_ratio", "entropy / first steps"),
)


def _plot_degeneration(ax: Any, rows: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    """Is the run being gamed: the train batch's measures, eval's degenerate share, and a red
    cross over every step or evaluation with an alarm (degen_alarms)."""
    for key, label in _DEGENERATION:
        if any(key in r for r in rows):
            ax.plot(*series(rows, key), marker=".", label=label)
    if any("degenerate_frac" in e for e in evals):
        ax.plot(*series(evals, "degenerate_frac", "version"), marker="s", label="eval degenerate")
    alarms = [r["step"] for r in rows if r.get("degen_alarms")]
    alarms += [e["version"] for e in evals if e.get("degen_alarms")]
    if alarms:
        ax.plot(alarms, [0.0] * len(alarms), "rx", ms=10, label="alarm (log says which)")
    ax.set_title("degeneration (reward hacking?)")
    if ax.get_legend_handles_labels()[0]:  # a run whose rows carry no measure draws none
        ax.legend(fontsize=7)


def _k_of(key: str) -> int:
    return int(key.removeprefix("pass@"))


def plot_run(run_dir: Path) -> Path | None:
    """Reward, accuracy and KL (or entropy) against step (plus eval pass@1, format rate and
    pass@k), and the degeneration measures with their alarms, written atomically as PNG."""
    rows = read_jsonl(run_dir / METRICS_FILE)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = read_jsonl(run_dir / EVAL_FILE)
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    axes[0].plot(*series(rows, "reward_mean"), marker="o")
    axes[0].set_title("mean reward (train batch)")
    axes[1].plot(*series(rows, "accuracy"), marker="o", label="train accuracy")
    axes[1].plot(*series(rows, "format_rate"), marker=".", label="train format")
    if evals:  # version v = the weights after step v, so it shares the step axis
        axes[1].plot(*series(evals, "accuracy", "version"), marker="s", label="eval pass@1")
        axes[1].plot(*series(evals, "format_rate", "version"), marker="^", label="eval format")
        overall = {k for e in evals for k in e if k.startswith("pass@") and "/" not in k}
        for key in sorted(overall, key=_k_of):  # a mixture's per-entry pass@k/<name>: not here
            axes[1].plot(*series(evals, key, "version"), marker="x", ls="--", label=f"eval {key}")
    axes[1].set_title("accuracy and format rate")
    axes[1].legend(fontsize=8)
    # Without a KL term there is no reference pass (grpo.config.passes), hence no KL: then
    # the policy's entropy, the other sign of how far it moved.
    third = "kl" if any("kl" in r for r in rows) else "entropy"
    axes[2].plot(*series(rows, third), marker="o")
    axes[2].set_title({"kl": "KL to reference", "entropy": "entropy (train batch)"}[third])
    _plot_degeneration(axes[3], rows, evals)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / PLOT_FILE
    tmp = run_dir / f".{PLOT_FILE}.tmp{os.getpid()}.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, out)
    return out
