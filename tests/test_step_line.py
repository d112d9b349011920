"""The trainer's console line per step (grpo/observe/step_line.py; issue 64, item 4)."""

from __future__ import annotations

from grpo.observe.step_line import StepClock, clock, step_line


def test_a_step_line_says_step_seconds_eta_and_the_numbers_a_person_watches():
    row = {"step": 5, "reward_mean": 0.078125, "format_rate": 0.78125, "accuracy": 0.0,
           "response_len_mean": 49.3, "kl": 0.00123, "loss": 0.5}  # fmt: skip
    assert step_line(row, 48, 112.34, 4811.0) == (
        "step  5/48 | 112.3 s | ETA 1:20:11 | reward 0.078 | format 0.78 | acc 0.00 | len 49 | "
        "kl 0.0012"
    )


def test_what_a_step_did_not_compute_is_left_out_and_an_alarm_is_named():
    alarms = ["degen_length_ratio", "degen_multi_marker_frac", "degen_repeat_frac"]
    row = {"step": 12, "reward_mean": 0.1, "degen_alarms": alarms}  # the watch's keys
    assert step_line(row, 12, 9.0, 0.0) == (
        "step 12/12 |   9.0 s | ETA 0:00 | reward 0.100 | ALARM length_ratio, multi_marker, repeat"
    )
    assert step_line({"step": 1}, 8, None, None) == "step 1/8 |     - s | ETA -"


def test_lines_of_one_run_are_aligned():
    lines = [step_line({"step": s, "reward_mean": 0.5}, 100, 3.0, 60.0) for s in (1, 10, 100)]
    assert len({line.index("|") for line in lines}) == 1


def test_the_clock_leaves_the_first_step_of_a_process_out_of_its_mean():
    c = StepClock(total=10, now=0.0)
    assert c.tick(1, now=50.0) == (None, None)  # includes the start: not a step's
    assert c.tick(2, now=60.0) == (10.0, 80.0)  # 8 steps left at 10 s
    assert c.tick(3, now=80.0) == (20.0, 105.0)  # at the mean, 15 s
    assert c.tick(12, now=90.0)[1] == 0.0  # past the end: nothing left
    assert clock(3725.4) == "1:02:05" and clock(59.6) == "1:00" and clock(-3) == "0:00"
