"""bench/e2e_vs_trl.py's scenario: both sides are told one workload, and `same_work` refuses a
comparison in which either did less (its quick run, both sides for real on the tiny model, is
tests/test_bench.py::test_benchmark_runs_quick[e2e_vs_trl])."""

from __future__ import annotations

import pytest

from bench.e2e_vs_trl import rates
from bench.workload import DifferentWork, Workload, same_work, step_work, trl_arguments

W = Workload(questions=2, group=2, new_tokens=4, steps=2, micro_batch=2)


def steps(questions=((1, 2), (3, 4)), group=2, length=4, prompt=10) -> list[tuple]:
    return [step_work([q for q in qs for _ in range(group)], [prompt] * len(qs) * group,
                      [length] * len(qs) * group) for qs in questions]  # fmt: skip


def test_the_same_work_passes():
    same_work(W, steps(), steps())


@pytest.mark.parametrize("trl, says", [
    (steps(group=1), "1 answers|2 answers, the workload 2 and 4"),
    (steps(length=3), "answers of \\[3\\] tokens"),
    (steps(questions=((1, 2),)), "TRL ran 1 steps"),
    (steps(questions=((1, 2), (3, 5))), "asked different questions"),
    (steps(prompt=9), "prompts of the same questions differ"),
])  # fmt: skip
def test_less_or_other_work_on_either_side_is_refused(trl, says):
    with pytest.raises(DifferentWork, match=says):
        same_work(W, steps(), trl)
    with pytest.raises(DifferentWork):
        same_work(W, trl, steps())


def test_answers_of_any_length_pass_when_the_length_is_not_fixed():
    free = Workload(**{**W.json(), "fixed_length": False})
    same_work(free, steps(length=4), steps(length=2))
    with pytest.raises(DifferentWork, match="different questions"):
        same_work(free, steps(), steps(questions=((1, 2), (3, 5))))


def test_rates_leave_the_first_step_out():
    rows = [{"time": t, "prompt_lens": [10, 10], "completion_lens": [4, 4]} for t in (5, 7, 11)]
    assert rates(rows) == {"generated": 16 / 6, "trained": 56 / 6, "step": 3.0}


def test_trl_is_configured_with_the_workload(tmp_path):
    w = Workload(questions=4, group=4, new_tokens=128, steps=3)
    args = trl_arguments(w, tmp_path, seed=7)
    assert (args.num_generations, args.max_completion_length) == (4, 128)
    assert args.generation_kwargs == {"min_new_tokens": 128}
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 16
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one step a batch
    assert (args.beta, args.max_grad_norm, args.learning_rate, args.temperature) == (
        0.0, 1.0, 4e-5, 0.8)  # fmt: skip
    assert args.lr_scheduler_type == "constant" and not args.shuffle_dataset
    with pytest.raises(ValueError, match="micro-batches"):
        trl_arguments(Workload(questions=3, group=2, new_tokens=8, steps=1), tmp_path, 0)


def test_the_learning_table_gives_each_evaluation_and_each_step():
    from bench.e2e_vs_trl import learning_table, per_step

    ours = [{"reward_mean": 0.1 * k, "completion_lens": [10, 20]} for k in range(2)]
    trl = [{"rewards": [0.0, 0.5], "completion_lens": [4, 6]} for _ in range(2)]
    evals = [{"accuracy": 0.0, "format_rate": f} for f in (0.25, 0.75, 0.5)]
    text = learning_table(*evals, per_step(ours), per_step(trl))
    assert "| ours v2 | 0 | 0.75 | nan |" in text  # its steps, as many as given
    assert "| TRL step 2 | 0 | 0.5 |" in text
    assert "| 2 | 0.100 | 0.250 | 15.0 | 5.0 |" in text
