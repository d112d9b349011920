"""Metrics rows leave out what was not computed, and the plot copes with the gaps."""

import json

from grpo.observe.metrics import plot_run, series


def test_series_skips_rows_without_the_key():
    rows = [{"step": 1, "vf_loss": 0.5}, {"step": 2, "kl": 0.1, "vf_loss": 0.4}]
    assert series(rows, "kl") == ([2], [0.1])
    assert series([{"version": 3, "accuracy": 0.5}], "accuracy", "version") == ([3], [0.5])


def test_plot_of_a_run_whose_first_rows_have_no_policy_metrics(tmp_path):
    """A PPO run whose critic warmed up for two steps: no loss, KL or grad_norm in those rows."""
    base = {"reward_mean": 0.1, "accuracy": 0.0, "format_rate": 0.5}
    rows = [{"step": 1, **base}, {"step": 2, **base}, {"step": 3, **base, "kl": 0.01}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [
        {"version": 0, "accuracy": 0.0, "format_rate": 0.4},  # greedy only, then pass@k
        {"version": 3, "accuracy": 0.1, "format_rate": 0.9, "pass@1": 0.2, "pass@4": 0.5},
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    out = plot_run(tmp_path)
    assert out is not None and out.stat().st_size > 1000
    assert not list(tmp_path.glob(".*tmp*"))  # written atomically
