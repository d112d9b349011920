"""Mixtures (data.mixture): several datasets in one run, each drawn by weight, scored by its own
reward and reported on its own in the metrics and the evaluation."""

from __future__ import annotations

import json
import pickle
from itertools import islice

import numpy as np
import pytest

from grpo.config import ConfigError, load_config
from grpo.eval.questions import EvalSpec, QuestionResult, summarise
from grpo.eval_cli import table
from grpo.observe.metrics import info_rates
from grpo.sampler.data import PICK_BLOCK, Shard, mixture_order, question_order
from grpo.tasks import get_task, score, task_for
from grpo.tasks.mixture import SOURCE_KEY
from tests.conftest import REPO, run_launch, transport_overrides

GSM8K = str(REPO / "data/gsm8k/train.jsonl")
MATH = str(REPO / "data/math500/train.jsonl")
MIXTURE = f"data.mixture=[{{train: {GSM8K}, weight: 3}}, {{task: math, train: {MATH}}}]"


def mixture_config(*overrides: str):
    return load_config(None, [MIXTURE, *overrides])


# ----------------------------------------------------------------------------- the draw


def test_the_mixture_order_is_a_pure_function_of_seed_and_position():
    """Any start gives the order from 0 from there on (a resumed sampler draws what the
    uninterrupted one would have), across a block of entry picks too; another seed another."""
    sizes, weights = [50, 7, 13], [3.0, 1.0, 0.5]
    full = list(islice(mixture_order(sizes, weights, 5, True), 3 * PICK_BLOCK))
    assert full == list(islice(mixture_order(sizes, weights, 5, True), 3 * PICK_BLOCK))
    for start in (1, 17, PICK_BLOCK - 1, PICK_BLOCK, PICK_BLOCK + 3, 2 * PICK_BLOCK + 100):
        resumed = list(islice(mixture_order(sizes, weights, 5, True, start), 200))
        assert resumed == full[start : start + 200], start
    assert list(islice(mixture_order(sizes, weights, 6, True), 200)) != full[:200]


def test_the_mixture_draws_each_entry_by_its_weight_and_each_row_once_an_epoch():
    sizes, weights = [400, 300], [3.0, 1.0]
    drawn = list(islice(mixture_order(sizes, weights, 0, True), 20_000))
    picks = np.array([k for k, _ in drawn])
    assert abs((picks == 0).mean() - 0.75) < 0.015
    # Each entry goes through its rows as its own seeded epochs: no row twice in one.
    for k, n in enumerate(sizes):
        rows = [i for e, i in drawn if e == k]
        assert sorted(rows[:n]) == list(range(n))
        assert rows[:n] != list(range(n))  # shuffled
        assert rows == list(islice(question_order(n, k * 1_000_003, True), len(rows)))


def test_a_mixture_shard_draws_each_entry_at_the_configured_share():
    """The weights of data.mixture (3 : 1) reach the shard's draw: over 4,000 positions the
    gsm8k share is 3/4 within four binomial standard deviations (0.027); equal weights would
    give 1/2."""
    cfg = mixture_config()
    shard = Shard(cfg, task_for(cfg), tokenizer=None)
    n, p = 4000, 0.75
    picks = np.array([k for k, _ in islice(shard.order(0), n)])
    share = float((picks == 0).mean())
    assert abs(share - p) <= 4 * (p * (1 - p) / n) ** 0.5, share


def test_a_single_dataset_draws_as_it_did():
    """No mixture: the shard's order is question_order's, the group ids the row indices."""
    cfg = load_config(None, [f"data.train={GSM8K}", "rollout.seed=3"])
    shard = Shard(cfg, task_for(cfg), tokenizer=None)
    assert len(shard.parts) == 1 and shard.size == 7473
    expected = list(islice(question_order(7473, 3, True), 50))
    assert list(islice(shard.order(0), 50)) == [(0, i) for i in expected]
    assert "mixture" not in shard.fingerprint()


def test_a_mixture_shard_tags_its_rows_and_gives_every_question_its_own_group_id():
    cfg = mixture_config("rollout.num_samplers=2", "rollout.sampler_index=1")
    shard = Shard(cfg, task_for(cfg), tokenizer=None)
    gsm8k, math = shard.parts
    assert (gsm8k.name, gsm8k.weight, math.name, math.weight) == ("gsm8k", 3.0, "math", 1.0)
    assert [i for i, _ in gsm8k.rows[:2]] == [1, 3] and [i for i, _ in math.rows[:2]] == [
        7473 + 1,
        7473 + 3,
    ]
    assert {r[SOURCE_KEY] for _, r in gsm8k.rows} == {"gsm8k"}
    assert {r[SOURCE_KEY] for _, r in math.rows} == {"math"}
    assert shard.fingerprint()["mixture"] == [["gsm8k", 3.0, 3736], ["math", 1.0, 200]]


def test_a_resumed_mixture_shard_draws_the_same_questions(base_model_dir):
    from grpo.models.loading import load_tokenizer

    cfg = mixture_config("rollout.questions_per_step=8")
    tokenizer = load_tokenizer(base_model_dir)
    first = Shard(cfg, task_for(cfg), tokenizer)
    for _ in range(3):
        first.draw()
    third = [p.index for p in first.draw()]
    assert any(i >= 7473 for i in third) and any(i < 7473 for i in third)  # from both entries
    resumed = Shard(cfg, task_for(cfg), tokenizer)
    resumed.position = first.position - len(third)  # as Shard.resume sets it from the spool
    assert [p.index for p in resumed.draw()] == third


# ----------------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    "mixture, message",
    [
        ("[{train: a, weight: 0}, {train: b, name: b}]", "entry 0: weight must be a finite"),
        ("[{train: a, weight: -1}, {train: b, name: b}]", "entry 0: weight must be a finite"),
        ("[{train: a}, {train: b}]", "entry 1: a second entry named 'gsm8k'"),
        ("[{train: a}]", "data.mixture has one entry"),
        ("[{name: x}, {train: b}]", "entry 0: no train rows"),
        ("[{train: a, wieght: 2}, {train: b, name: b}]", "entry 0: unknown key 'wieght'"),
        ("[{train: a, reward: f}, {train: b, name: b}]", "entry 0: reward must look like"),
        ("[{train: a, name: 'a b'}, {train: b}]", "entry 0: name 'a b' must be"),
    ],
)
def test_a_bad_mixture_entry_is_one_config_error(mixture, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(None, [f"data.mixture={mixture}"])
    assert "\n" not in str(err.value)


def test_an_entry_of_an_unknown_task_is_one_config_error():
    cfg = load_config(None, ["data.mixture=[{train: a, task: nope}, {train: b}]"])
    with pytest.raises(
        ConfigError, match="entry 0: task: unknown task 'nope'; valid: addition, arithmetic, gsm8k"
    ):
        task_for(cfg)  # as the sampler and the evaluations build it
    cfg = load_config(
        None, ["data.mixture=[{train: a, reward: 'no_such:fn'}, {train: b, name: b}]"]
    )
    with pytest.raises(ConfigError, match="entry 0: reward: "):
        task_for(cfg)


def test_data_train_or_reward_beside_a_mixture_is_refused():
    with pytest.raises(ConfigError, match="data.reward is set beside data.mixture"):
        mixture_config("data.reward=tests.rewards_for_tests:text_length")
    with pytest.raises(ConfigError, match="data.train is set beside data.mixture"):
        mixture_config(f"data.train={GSM8K}")


# ----------------------------------------------------------------------------- the rewards


def test_each_row_is_prompted_and_scored_by_its_entrys_task():
    cfg = mixture_config()
    task = task_for(cfg)
    g = {"question": "What is 2 + 3?", "answer": "#### 5", SOURCE_KEY: "gsm8k"}
    m = {"problem": "Compute 2 + 3.", "answer": "5", SOURCE_KEY: "math"}
    assert task.build_messages(g, "") == get_task("gsm8k").build_messages(g, "")
    assert task.build_messages(m, "") == get_task("math").build_messages(m, "")
    reward = pickle.loads(pickle.dumps(task.reward))  # the reward workers get it pickled
    answer = "The answer is \\boxed{\\frac{1}{2}}."
    row = {"question": "p", "problem": "p", "answer": "\\frac{1}{2}"}
    for name, other in (("gsm8k", "math"), ("math", "gsm8k")):
        tagged = {**row, SOURCE_KEY: name}
        value, info = score(get_task(name).reward, answer, tagged)
        assert reward(answer, tagged) == (value, {**info, "data_source": name})
        assert score(get_task(other).reward, answer, tagged)[1] != info  # not the same reward


def test_a_failing_entry_reward_still_counts_for_its_entry():
    cfg = load_config(None, [
        f"data.mixture=[{{train: {GSM8K}}}, {{train: {MATH}, name: broken, "
        "reward: 'tests.rewards_for_tests:always_raises'}]",
    ])  # fmt: skip
    reward = task_for(cfg).reward
    value, info = reward("x", {"problem": "p", "answer": "1", SOURCE_KEY: "broken"})
    assert value == 0.0 and info["data_source"] == "broken" and "reward_error" in info


# ----------------------------------------------------------------------------- the metrics


def test_per_source_metrics_of_a_batch():
    infos = [
        {"correct": True, "formatted": True, "data_source": "gsm8k"},
        {"correct": False, "formatted": True, "data_source": "gsm8k"},
        {"correct": True, "formatted": False, "data_source": "math"},
        {"correct": False, "formatted": False, "data_source": "gsm8k"},
    ]
    row = info_rates(infos, [1.0, 0.5, 1.0, 0.0])
    assert row["accuracy"] == 0.5
    assert row["accuracy/gsm8k"] == pytest.approx(1 / 3) and row["accuracy/math"] == 1.0
    assert row["format_rate/gsm8k"] == pytest.approx(2 / 3) and row["format_rate/math"] == 0.0
    assert row["reward_mean/gsm8k"] == 0.5 and row["reward_mean/math"] == 1.0
    assert row["source_frac/gsm8k"] == 0.75 and row["source_frac/math"] == 0.25
    assert "reward_mean/gsm8k" not in info_rates(infos)  # no rewards given: no reward means


def test_a_single_dataset_batch_has_no_per_source_keys():
    rates = info_rates([{"correct": True, "formatted": True}], [1.0])
    assert set(rates) == {"accuracy", "format_rate"}


def test_the_evaluation_reports_each_entry():
    spec = EvalSpec.from_config(load_config(None, ["eval.samples=2"]))
    results = [
        QuestionResult(0, True, True, 2, "gsm8k"),
        QuestionResult(1, False, True, 0, "gsm8k"),
        QuestionResult(2, False, False, 1, "math"),
    ]
    row = summarise(results, spec, 4, 1.0)
    assert row["accuracy"] == pytest.approx(1 / 3) and row["n"] == 3
    assert row["accuracy/gsm8k"] == 0.5 and row["n/gsm8k"] == 2 and row["n/math"] == 1
    assert row["pass@2/gsm8k"] == 0.5 and row["pass@2/math"] == 1.0
    assert row["format_rate/math"] == 0.0
    head, _, line = table([row]).splitlines()
    assert head.split(" | ")[-4:-2] == ["gsm8k pass@1", "math pass@1"]
    assert line.split(" | ")[-4:-2] == ["0.500", "0.000"]
    assert "gsm8k" not in table([summarise([QuestionResult(0, True, True)], spec, 4, 1.0)])


# ----------------------------------------------------------------------------- a real run


@pytest.mark.extended  # CI leaves it out; mixture sampling and metrics: unit tests
@pytest.mark.slow
def test_a_run_on_a_gsm8k_and_math500_mixture(tmp_path, tiny_model_dir):
    """Two steps on gsm8k + math500: every answer scored by its entry's reward (none fails),
    the metrics and the evaluations per entry."""
    from tests.test_integration import tiny_config

    config = tiny_config(
        tmp_path, tiny_model_dir,
        train={"total_steps": 2, "num_ranks": 1},
        data={"reward": "", "mixture": [
            {"train": GSM8K, "test": GSM8K.replace("train", "test"), "weight": 1},
            {"task": "math", "train": MATH, "test": MATH.replace("train", "test"), "weight": 1},
        ]},
        rollout={"questions_per_step": 8, "group_size": 2},
        eval={"interval": 2, "num_questions": 2, "max_new_tokens": 8},
        reward={"workers": 1},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = tmp_path / "runs/tiny"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward_errors"] == 0, r
        fracs = {k: v for k, v in r.items() if k.startswith("source_frac/")}
        assert set(fracs) <= {"source_frac/gsm8k", "source_frac/math"} and sum(fracs.values()) == 1
        assert all(0 <= r[f"accuracy/{k[12:]}"] <= 1 for k in fracs)
    assert {k for r in rows for k in r if k.startswith("source_frac/")} == {
        "source_frac/gsm8k",
        "source_frac/math",
    }
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert evals and all(e["n/gsm8k"] == 2 and e["n/math"] == 2 and e["n"] == 4 for e in evals)
    assert all(0 <= e["accuracy/math"] <= 1 for e in evals)
    saved = load_config(run_dir / "config.yaml").data.mixture  # the run's record of it
    assert [(e.get("task"), e["weight"]) for e in saved] == [(None, 1), ("math", 1)]
