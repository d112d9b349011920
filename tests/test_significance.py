"""Issue 58, item 5: whether held-out accuracy moved is said with a p-value, by the two-sided
two-proportion z-test, in the closing summary of a run with two evaluations or more."""

from __future__ import annotations

import json

import pytest

from grpo.eval.significance import accuracy_change, two_proportion_p


def test_the_p_value_is_the_two_sided_pooled_z_tests():
    # 20 of 100 against 35 of 100: pooled 0.275, z = 0.15 / 0.06315 = 2.375, p = 0.0175.
    assert two_proportion_p(20, 100, 35, 100) == pytest.approx(0.01753, abs=1e-4)
    assert two_proportion_p(35, 100, 20, 100) == pytest.approx(0.01753, abs=1e-4)
    # Unequal counts: pooled over all 250 answers (0.28), not the mean of the two shares (0.25).
    assert two_proportion_p(10, 50, 60, 200) == pytest.approx(0.1590, abs=1e-3)
    # 50 of 100 each: nothing moved.
    assert two_proportion_p(50, 100, 50, 100) == pytest.approx(1.0)
    # z = 1.96 is p = 0.05: 0.5 against 0.5 + 1.96 * sqrt(0.25 * 2 / n) with the pooled share ~0.5.
    assert 0.04 < two_proportion_p(500, 1000, 544, 1000) < 0.06


@pytest.mark.parametrize("counts", [(0, 0, 3, 10), (0, 10, 0, 10), (10, 10, 10, 10)])
def test_nothing_to_tell_apart_is_p_one(counts):
    assert two_proportion_p(*counts) == 1.0


def test_the_change_is_said_per_prompt_set_with_its_question_count():
    first = {"version": 0, "accuracy": 7 / 256, "n": 256, "accuracy@reworded": 2 / 256,
             "n@reworded": 256}  # fmt: skip
    last = {"version": 48, "accuracy": 30 / 256, "n": 256, "accuracy@reworded": 3 / 256,
            "n@reworded": 256}  # fmt: skip
    main, reworded = accuracy_change(first, last)
    assert main.startswith("accuracy 0.027 -> 0.117 of 256 questions, p = ")
    assert main.endswith("(significant)")
    assert reworded.startswith("reworded 0.008 -> 0.012 of 256 questions, p = ")
    assert reworded.endswith("(not significant)")


def test_the_closing_summary_compares_the_first_evaluation_with_the_last(tmp_path, capsys):
    from grpo.trainer.outputs import summarise_run

    run = tmp_path / "run"
    (run / "versions" / "v000004").mkdir(parents=True)
    row = {"step": 1, "sampler_id": "sampler-0", "reward_mean": 0.5, "completion_lens": [3],
           "staleness": 0, "time": 1.0}  # fmt: skip
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    evals = [{"version": 0, "accuracy": 0.1, "n": 200}, {"version": 2, "accuracy": 0.5, "n": 200},
             {"version": 4, "accuracy": 0.2, "n": 200}]  # fmt: skip
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    summarise_run(run, 4, 4)
    out = capsys.readouterr().out
    p = two_proportion_p(20, 200, 40, 200)
    assert (f"  held out:    v0 -> v4: accuracy 0.100 -> 0.200 of 200 questions, p = {p:.2g} "
            "(significant)\n") in out  # fmt: skip


def test_one_evaluation_says_nothing_of_a_change(tmp_path, capsys):
    from grpo.trainer.outputs import held_out_change

    (tmp_path / "eval.jsonl").write_text(json.dumps({"version": 0, "accuracy": 0.1, "n": 9}) + "\n")
    assert held_out_change(tmp_path) == ""
    assert held_out_change(tmp_path / "missing") == ""


def test_significant_means_below_five_percent():
    near = accuracy_change({"accuracy": 0.5, "n": 1000}, {"accuracy": 0.54, "n": 1000})
    assert near == ["accuracy 0.500 -> 0.540 of 1000 questions, p = 0.073 (not significant)"]
    past = accuracy_change({"accuracy": 0.5, "n": 1000}, {"accuracy": 0.55, "n": 1000})
    assert past[0].endswith("(significant)")
