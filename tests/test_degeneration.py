"""The degeneration measures and the alarm (grpo.observe.degeneration): answer spam is counted,
named once with an example, and reaches metrics.jsonl, eval.jsonl, samples.jsonl and the plot."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest

from grpo.config import load_config
from grpo.core.episode import EpisodeBatch
from grpo.observe.degeneration import THRESHOLDS, Watch, flags, measures, past, ratio
from grpo.observe.run_log import RunLog
from grpo.tasks.gsm8k import count_markers
from tests.test_episode import make_batch

WORKED = "She sold 48 in April and half as many in May, so 48 + 24 = 72 in all.\n#### 72"
SPAM = "#### 2\n" * 20
LOOP = "Next we add the eggs to the basket and count them again.\n" * 4 + "#### 9"
GLUED = "She sold 48 in April and half as many in May, so 48 + 24 = 72 in all.\n#### 72####"


def test_each_answer_is_flagged_for_what_it_repeats_and_how_many_markers_it_holds():
    assert flags(WORKED, count_markers) == []
    assert flags(SPAM, count_markers) == ["repeats itself", "20 answer markers"]
    assert flags(LOOP, count_markers) == ["repeats itself"]
    assert flags(GLUED, count_markers) == ["2 answer markers"]
    assert flags(GLUED, None) == []  # a task without markers: repetition only
    # Two lines alike are working (a recap), three are a loop; a short line ("= 5") is neither.
    assert flags("Add 2 and 3 to get 5 apples.\n" * 2 + "#### 5", None) == []
    assert flags("= 5\n" * 6, None) == []


def test_the_measures_are_shares_of_the_answers_and_of_those_the_reward_paid():
    texts = [WORKED, SPAM, LOOP, GLUED]
    row = measures(texts, rewards=[1.0, 0.0, 0.1, 1.0], refused=[False, True, False, False],
                   count_markers=count_markers)  # fmt: skip
    assert row["degen_repeat_frac"] == 0.5  # SPAM, LOOP
    assert row["degen_multi_marker_frac"] == 0.5  # SPAM, GLUED
    assert row["degenerate_frac"] == 0.75
    # Of the three paid for, LOOP and GLUED are degenerate: a lenient reward pays for spam.
    assert row["degen_refused_frac"] == pytest.approx(2 / 3)
    none_paid = measures(texts, [0.0] * 4, [False] * 4, None)
    assert "degen_refused_frac" not in none_paid and "degen_multi_marker_frac" not in none_paid
    assert measures([], [], [], count_markers) == {}


# The CPU demo's last answers (2026-12-02): worked in form, their sums mostly false.
DEMO_ANSWERS = {
    "Janet has 16 * 3 = 48 ducks laying 16 * 3 = 48 eggs per day. She eats 2 * 3 = 6 eggs per "
    "day. She makes 48 - 6 = 32 ducks at the farmers' market.\n#### 32": [
        ("16 * 3 = 48", True), ("16 * 3 = 48", True), ("2 * 3 = 6", True), ("48 - 6 = 32", False),
    ],
    "James runs 60 meters each sprint * 3 sprints = 180 meters per sprint.  So he runs 180 - 60 "
    "= 120 meters per week.\n#### 120": [("180 - 60 = 120", True)],
    "This increased the value of the house by 150% - 50% = 25%.\n#### 25": [],  # percentages
    "Each wash is $24.00/240 = $0.10, and 1,200 + 3 x 100 = 1,500 in all.\n#### 1500": [
        ("24.00/240 = 0.10", True), ("1200 + 3 x 100 = 1500", True),
    ],
}  # fmt: skip


@pytest.mark.parametrize("text", list(DEMO_ANSWERS))
def test_each_equation_of_plain_numbers_is_checked(text):
    from grpo.tasks.answer_form import equations

    assert equations(text) == DEMO_ANSWERS[text]


def test_false_arithmetic_is_measured_among_the_answers_that_state_any():
    """Issue 58, what the demo's answers showed once their final numbers were their working's:
    the form is learned, the arithmetic is not; no reward here checks it, so it is a measure
    (no alarm). Of the three answers stating an equation, one holds a false one; an answer
    stating none does not count; a bound on the work per "=" keeps it linear."""
    from grpo.tasks.answer_form import equations
    from tests.growth import LINEAR_BOUND, time_growth

    texts = list(DEMO_ANSWERS)
    row = measures(texts, [0.1] * 4, [False] * 4, count_markers)
    assert row["degen_false_equation_frac"] == pytest.approx(1 / 3)
    assert "degen_false_equation_frac" not in measures(
        ["No sums here.\n#### 3"], [0.0], [False], None
    )
    assert time_growth(equations, lambda n: "1 + " * (n // 4) + "= 5", 1000) < LINEAR_BOUND


@pytest.mark.parametrize(
    "measure, value, alarmed",
    [
        ("degen_repeat_frac", 0.2, False),
        ("degen_repeat_frac", 0.21, True),
        ("degen_multi_marker_frac", 0.11, True),
        ("degen_refused_frac", 0.25, True),
        ("degen_length_ratio", 0.39, True),
        ("degen_length_ratio", 0.41, False),
        ("degen_length_ratio", 2.6, True),
        ("degen_length_ratio", 2.4, False),
        ("degen_entropy_ratio", 0.39, True),
        ("degen_entropy_ratio", 0.5, False),
    ],
)
def test_each_threshold_is_the_documented_one(measure, value, alarmed):
    assert bool(past({measure: value})) is alarmed


def _step(watch: Watch, step: int, texts: list[str], **row) -> dict:
    row = {"step": step, "response_len_mean": 40.0, "entropy": 1.0, **row}
    paid = [0.0 if flags(t, count_markers) else 0.1 for t in texts]  # as the GSM8K reward pays
    watch.step(row, texts, paid, [False] * len(texts))
    return row


def test_the_alarm_names_the_measure_with_an_example_once_and_again_only_on_change(caplog):
    watch = Watch(count_markers)
    with caplog.at_level(logging.INFO, logger="grpo.trainer"):
        for step in (1, 2, 3):
            assert _step(watch, step, [WORKED] * 4)["degen_alarms"] == []
        assert not caplog.records
        for step in range(4, 30):  # spam for 26 steps: one warning, not 26
            row = _step(watch, step, [SPAM, SPAM, WORKED, WORKED])
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert row["degen_alarms"] == ["degen_multi_marker_frac", "degen_repeat_frac"]
        assert len(warnings) == 2, warnings
        assert warnings[0].startswith("reward hacking? step 4: degen_multi_marker_frac 0.500")
        assert "'#### 2\\n#### 2\\n" in warnings[0]  # the offending answer, quoted
        caplog.clear()
        _step(watch, 30, [WORKED] * 4)
        said_at_30 = [r.getMessage() for r in caplog.records]
        caplog.clear()
        _step(watch, 31, [WORKED] * 4)  # still within: nothing more to say
        assert not caplog.records
        _step(watch, 32, [SPAM, SPAM, WORKED, WORKED])  # gamed again: said again
    assert said_at_30 == [
        "step 30: degen_multi_marker_frac back within its threshold",
        "step 30: degen_repeat_frac back within its threshold",
    ]
    again = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(again) == 2 and again[0].startswith("reward hacking? step 32: ")


def test_a_ratio_to_nothing_is_no_ratio():
    """A baseline of empty answers (length 0) or no entropy gives no ratio, not a crash."""
    assert ratio(5.0, 0.0) is None and ratio(5.0, None) is None and ratio(None, 2.0) is None
    assert ratio(3.0, 2.0) == 1.5


def test_length_and_entropy_are_measured_against_the_first_steps(caplog):
    watch = Watch(None)
    _step(watch, 1, [WORKED], response_len_mean=80.0, entropy=1.0)
    _step(watch, 2, [WORKED], response_len_mean=120.0, entropy=0.8)
    with caplog.at_level(logging.WARNING, logger="grpo.trainer"):
        row = _step(watch, 3, ["#### 7", WORKED], response_len_mean=30.0, entropy=0.3)
    assert row["degen_length_ratio"] == pytest.approx(0.3)
    assert row["degen_entropy_ratio"] == pytest.approx(0.3 / 0.9)
    assert row["degen_alarms"] == ["degen_entropy_ratio", "degen_length_collapse"]
    collapse = [r.getMessage() for r in caplog.records if "degen_length_ratio" in r.getMessage()]
    assert collapse and collapse[0].endswith("e.g. '#### 7'")  # the shortest answer
    assert collapse[0].startswith("reward hacking? step 3: ")
    # Entropy alone falls as a policy grows sure of right answers too: not called hacking.
    sure = [r.getMessage() for r in caplog.records if "degen_entropy_ratio" in r.getMessage()]
    assert sure and sure[0].startswith("exploring less? step 3: degen_entropy_ratio 0.333")
    # A resumed run measures against the rows its first steps wrote, not its own first rows.
    resumed = Watch(None, first_steps=[{"step": 1, "response_len_mean": 80.0, "entropy": 1.0}])
    assert _step(resumed, 9, [WORKED], response_len_mean=40.0)["degen_length_ratio"] == 0.5
    # ... and only against the first BASELINE_STEPS of them, however many it wrote.
    written = [{"step": n, "response_len_mean": 80.0 if n <= 2 else 10.0} for n in range(1, 9)]
    assert _step(Watch(None, first_steps=written), 9, [WORKED], response_len_mean=40.0)[
        "degen_length_ratio"
    ] == pytest.approx(0.5)


class _Text:
    """A tokenizer whose token i is the i-th of `pieces`."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] if i < len(self.pieces) else "?" for i in ids)


def _batch_of(answers: list[list[int]], rewards: list[float]) -> EpisodeBatch:
    base = make_batch(num_groups=1, group_size=len(answers), rollout=False)
    episodes = []
    for e, ids, reward in zip(base.episodes, answers, rewards, strict=True):
        ids = np.asarray(ids, dtype=np.int32)
        logp = np.full(len(ids), -0.5, dtype=np.float32)
        episodes.append(dataclasses.replace(
            e, completion_ids=ids, old_logp=logp, ref_logp=logp, reward=reward,
            reward_info={"formatted": reward > 0},
        ))  # fmt: skip
    return EpisodeBatch(episodes=tuple(episodes), group_size=len(answers), policy_version=0, seq=0,
                        sampler_id="sampler-0", stats={})  # fmt: skip


def test_a_run_log_writes_the_measures_and_each_answers_flags(tmp_path, caplog, capsys):
    """Through RunLog, as the trainer's rank 0 calls it: the step's row in metrics.jsonl carries
    the measures of its decoded answers, samples.jsonl each shown answer's flags, the warning
    is logged, `grpo samples` shows the flags, and the plot draws the measures."""
    from grpo.observe.samples import main as samples_main

    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run", "logging.tensorboard=false",
                             "logging.samples_per_step=4"])  # fmt: skip
    pieces = ["#### 2\n", "She sold 48 and then 24 more clips, so 72 in all.\n", "#### 72"]
    log = RunLog(cfg, tokenizer=_Text(pieces))
    with caplog.at_level(logging.WARNING, logger="grpo.trainer"):
        log.step({"step": 1, "reward_mean": 0.5}, _batch_of([[0] * 20, [1, 2], [0], [1, 2]],
                                                         [0.1, 1.0, 0.0, 1.0]))  # fmt: skip
        log.eval({"version": 1, "accuracy": 0.5, "format_rate": 0.5, "n": 2,
                  "degen_repeat_frac": 0.5, "response_len_mean": 10.0,
                  "_answers": [pieces[0] * 20, pieces[1] + pieces[2]]})  # fmt: skip
    log.close()
    run = tmp_path / "run"
    (row,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["degen_repeat_frac"] == 0.25 and row["degen_multi_marker_frac"] == 0.25
    # and the reward paid 0.1 for the spam: one of the three answers it paid for
    assert row["degen_refused_frac"] == pytest.approx(1 / 3)
    assert row["degen_alarms"] == [
        "degen_multi_marker_frac", "degen_refused_frac", "degen_repeat_frac"
    ]  # fmt: skip
    (evaluated,) = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert evaluated["degen_alarms"] == ["degen_repeat_frac"] and "_answers" not in evaluated
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("reward hacking? eval v1: degen_repeat_frac 0.500") for m in said)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    spam = [s for s in samples if s["answer"].startswith("#### 2\n#### 2")]
    assert spam and spam[0]["flags"] == ["repeats itself", "20 answer markers"]
    assert samples_main([str(run), "-n", "8"]) == 0
    out = capsys.readouterr().out
    assert "reward 0.100 [repeats itself] [20 answer markers]" in out
    assert out.startswith("degeneration alarms (reward hacking?), newest:\n  step 1: degen_multi")
    assert "\n  eval v1: degen_repeat_frac\n" in out
    from grpo.observe.metrics import plot_run

    assert plot_run(run).stat().st_size > 0  # its fourth panel: the measures and the alarms


def test_the_thresholds_table_is_the_documented_one():
    """docs/outputs.md gives each threshold; a change to one is a change to both."""
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "outputs.md").read_text()
    for name, (bound, side) in THRESHOLDS.items():
        assert f"| `{name}` | {side} {bound:g} |" in doc, name
