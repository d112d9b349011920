"""The MATH task: MATH-500's split, math-verify grading, and the checker's timeout and errors.

The reward's checks run in one child process per test worker (grpo/tasks/math500.py says why);
it starts in about a second and is shared by these tests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time

import pytest
import yaml

from grpo.config import load_config
from grpo.tasks import REPO_ROOT, get_task, math500, score, task_names
from grpo.tasks.math500 import (
    ANSWER_INSTRUCTION,
    FORMAT_REWARD,
    CheckerError,
    build_messages,
    check,
    extract_boxed,
    reward,
)

DATA = REPO_ROOT / "data" / "math500"


def _rows(name: str) -> list[dict]:
    with (DATA / f"{name}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------
# Data: the committed split
# ---------------------------------------------------------------------------


def test_split_is_disjoint_complete_and_reproducible():
    train, test = _rows("train"), _rows("test")
    assert (len(train), len(test)) == (400, 100)
    train_ids, test_ids = {r["unique_id"] for r in train}, {r["unique_id"] for r in test}
    assert len(train_ids) == 400 and len(test_ids) == 100
    assert not train_ids & test_ids

    # The recipe in data/math500/README.md picks exactly the committed held-out rows.
    def key(r):
        return (r["subject"], r["level"], hashlib.sha256(r["unique_id"].encode()).hexdigest())

    assert {r["unique_id"] for r in sorted(train + test, key=key)[::5]} == test_ids
    for row in train + test:
        assert set(row) == {"problem", "answer", "subject", "level", "unique_id"}
    assert (DATA / "LICENSE").read_text().startswith("MIT License")


# ---------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        (r"\frac{1}{2}", "0.5"),
        (r"\frac{1}{2}", "1/2"),
        (r"\frac{1}{2}", r"\dfrac12"),
        (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2"),
        (r"\frac{\sqrt2}{2}", r"\frac{1}{\sqrt{2}}"),
        (r"(-\infty, 3]", r"(-\infty,3]"),
        (r"30^\circ", "30"),
        ("30", r"30^{\circ}"),
        (r"\text{Evelyn}", "Evelyn"),
        (r"\text{Evelyn}", r"\text{evelyn}"),
        ("-2, 1", "1, -2"),
        (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)"),
        (r"10\%", "10"),
        (r"\$18.90", "18.9"),
        (r"1,\!000", "1000"),
        (r"\text{(C)}", "C"),
        ("x^2+2x+1", "(x+1)^2"),
        (r"6\text{ inches}", "6"),
    ],
)
def test_equivalent_forms_are_correct(gold, pred):
    assert check(gold, pred) == (True, True)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        (r"\frac{1}{2}", "0.51"),
        (r"(-\infty, 3]", r"(-\infty, 3)"),
        (r"\text{Evelyn}", r"\text{Bob}"),
        ("-2, 1", "1"),
        (r"\sqrt{2}", "2"),
    ],
)
def test_different_answers_are_wrong(gold, pred):
    assert check(gold, pred) == (True, False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{ 2 }", "2"),
        (r"\boxed{3} and an empty \boxed{ }", "3"),
        (r"\boxed {\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        ("the answer is 3", None),
        (r"\boxed{}", None),
        (r"\boxed{unclosed", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "\\boxed{" * (n // 7),  # none closes
        lambda n: "\\boxed{" * (n // 16) + "\\boxed{ }" + "}" * (n // 16),  # nested, empty
    ],
    ids=["unclosed", "nested"],
)
def test_extract_boxed_is_linear(make):
    """finding 5: balancing each `\\boxed{` from its start read the rest of the text once per
    box (quadratic Python); the Python lines run now grow with the text, not its square."""
    from tests.growth import FACTOR, line_events

    assert extract_boxed(make(8000)) is None
    assert extract_boxed(make(8000) + r" \boxed{x^2}") == "x^2"
    small, large = line_events(extract_boxed, make(500)), line_events(extract_boxed, make(4000))
    assert large <= FACTOR * small * 1.2 + 50, (small, large)


# The value's parts for GDPO, as GSM8K's: format 0.1 when parseable, answer 0.9 when right.
RIGHT = {"reward/format": 0.1, "reward/answer": 0.9}
FORMATTED = {"reward/format": 0.1, "reward/answer": 0.0}
NEITHER = {"reward/format": 0.0, "reward/answer": 0.0}
# Working enough for the worked-answer rules (grpo.tasks.answer_form.MIN_WORKING_WORDS).
WORK = "Halve the whole, since two equal parts make it up, and simplify.\n"


def test_reward_values_and_info():
    row = {"problem": "p", "answer": r"\frac{1}{2}"}
    assert reward(WORK + r"so \boxed{0.5}", row) == (
        1.0,
        {
            "formatted": True,
            "correct": True,
            "pred": "0.5",
            "gold": r"\frac{1}{2}",
            "markers": 1,
            **RIGHT,
        },  # fmt: skip
    )
    assert reward(WORK + r"\boxed{3}", row) == (
        FORMAT_REWARD,
        {
            "formatted": True,
            "correct": False,
            "pred": "3",
            "gold": r"\frac{1}{2}",
            "markers": 1,
            **FORMATTED,
        },  # fmt: skip
    )
    assert FORMAT_REWARD == 0.1  # the GSM8K value, for the same reason
    assert reward("it is 1/2", row) == (
        0.0,
        {
            "formatted": False,
            "correct": False,
            "pred": None,
            "gold": r"\frac{1}{2}",
            "markers": 0,
            **NEITHER,
        },  # fmt: skip
    )
    value, info = reward(WORK + "\\boxed{" + "+".join(map(str, range(100))) + "}", row)
    assert value == FORMAT_REWARD and len(info["pred"]) == math500.PRED_CHARS + 3


def test_unboxed_answer_never_reaches_the_checker(monkeypatch):
    def fail(*args):
        raise AssertionError("checker called")

    monkeypatch.setattr(math500._CHECKER, "check", fail)
    assert reward(WORK + r"\boxed{} 0.5", {"answer": "0.5"})[0] == 0.0
    # nor does answer spam: it is refused before math-verify reads it
    assert reward(WORK + r"\boxed{0.5}\boxed{0.5}", {"answer": "0.5"})[0] == 0.0


@pytest.mark.parametrize(
    "text, why",
    [
        (r"\boxed{0.5}", "no working before the answer"),
        (WORK + r"\boxed{0.5} \boxed{0.5}", "2 answer markers"),
        (WORK + r"\boxed{0.5}" + "\nSo the answer is one half, as shown.", "text after the answer"),
        (WORK * 3 + r"\boxed{0.5}", "repeats itself"),
    ],
)
def test_math_spam_earns_nothing(text, why):
    value, info = reward(text, {"answer": "0.5"})
    assert (value, info["formatted"], info["refused"]) == (0.0, False, why)
    assert reward(WORK + r"$\boxed{0.5}$.", {"answer": "0.5"})[0] == 1.0


def test_every_gold_answer_verifies_against_itself():
    """All 500 MATH-500 answers, boxed, through the reward's real path (about 3 s)."""
    rows = _rows("train") + _rows("test")
    wrong = [
        (r["unique_id"], r["answer"])
        for r in rows
        if score(reward, WORK + f"Answer: \\boxed{{{r['answer']}}}", r)[0] != 1.0
    ]
    assert wrong == []


# ---------------------------------------------------------------------------
# Checker errors and timeouts
# ---------------------------------------------------------------------------


def test_checker_error_scores_zero_with_reward_error(monkeypatch, caplog):
    def broken(gold, pred, timeout):
        raise CheckerError("math-verify: ValueError: boom")

    monkeypatch.setattr(math500._CHECKER, "check", broken)
    value, info = score(reward, WORK + r"\boxed{1}", {"answer": "1"})
    assert (value, info) == (0.0, {"reward_error": "CheckerError: math-verify: ValueError: boom"})
    assert "math500:reward failed" in caplog.text


def test_hang_times_out_scores_zero_and_the_checker_restarts(monkeypatch):
    """SymPy evaluating 10^(10^(10^10)) never returns to Python; the child is killed."""
    row = {"answer": "3"}
    assert score(reward, WORK + r"\boxed{3}", row)[0] == 1.0  # the child is up
    monkeypatch.setattr(math500, "CHECK_TIMEOUT_S", 0.5)
    start = time.monotonic()
    value, info = score(reward, WORK + r"\boxed{10^{10^{10^{10}}}}", row)
    assert time.monotonic() - start < 5
    assert value == 0.0
    assert info == {
        "reward_error": "TimeoutError: math-verify did not check the answer within 0.5 s"
    }
    monkeypatch.setattr(math500, "CHECK_TIMEOUT_S", 30.0)  # slack for a loaded CPU
    assert score(reward, WORK + r"\boxed{3.0}", row) == (
        1.0,
        {"formatted": True, "correct": True, "pred": "3.0", "gold": "3", "markers": 1, **RIGHT},
    )


def test_checker_survives_its_process_dying():
    row = {"answer": "7"}
    assert reward(WORK + r"\boxed{7}", row)[0] == 1.0
    math500._CHECKER._proc.kill()
    math500._CHECKER._proc.wait()
    assert reward(WORK + r"\boxed{7}", row)[0] == 1.0


def test_checker_dying_mid_check_scores_zero_with_reward_error(monkeypatch):
    running = math500._Checker._running

    def running_then_killed(self):
        proc = running(self)
        proc.kill()
        proc.wait()
        return proc

    monkeypatch.setattr(math500._Checker, "_running", running_then_killed)
    value, info = score(reward, WORK + r"\boxed{7}", {"answer": "7"})
    assert value == 0.0
    assert info["reward_error"].startswith(("CheckerError: ", "BrokenPipeError: "))
    monkeypatch.undo()
    assert reward(WORK + r"\boxed{7}", {"answer": "7"})[0] == 1.0


_HUNG_PARENT = """
from grpo.tasks import math500
print(math500._CHECKER._running().pid, flush=True)
math500._CHECKER.check("1", "10^{10^{10^{10}}}", 3600.0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_parent_leaves_no_checker_behind():
    """finding 10: a sampler SIGKILLed during a hung SymPy check left math-verify's child
    running for good. The child now dies with its parent: a parent process starts the checker
    and sends it a check that never ends; once the child is busy on it, the parent is killed."""
    from tests.orphans import cpu_seconds, kill_if_running, running, wait_until

    parent = subprocess.Popen(
        [sys.executable, "-c", _HUNG_PARENT], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        idle = cpu_seconds(child)
        assert wait_until(lambda: cpu_seconds(child) > idle + 1.0, 120), "the check never ran"
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not running(child), 10), f"checker {child} outlived its parent"
    finally:
        parent.kill()
        kill_if_running(child)


def test_reward_from_other_threads():
    """The sampler may score outside the main thread, where SIGALRM timeouts cannot work."""
    results: dict[int, tuple[float, dict]] = {}

    def run(i: int) -> None:
        results[i] = score(reward, WORK + f"\\boxed{{{i}/2}}", {"answer": str(i / 2)})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {i: v for i, (v, _) in results.items()} == {i: 1.0 for i in range(4)}


# ---------------------------------------------------------------------------
# Task, registry and config
# ---------------------------------------------------------------------------


def test_math_task_registered_with_defaults(tmp_path, monkeypatch):
    task = get_task("math")
    assert "math" in task_names()
    assert task.reward is reward
    assert (task.default_train, task.default_test) == (
        "data/math500/train.jsonl",
        "data/math500/test.jsonl",
    )
    monkeypatch.chdir(tmp_path)  # relative defaults resolve from the repo root
    assert len(task.load(task.default_train)) == 400
    assert len(task.load(task.default_test)) == 100


def test_loader_validates_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(ValueError, match="row 0 has no 'answer'"):
        get_task("math").load(str(path))


def test_build_messages_asks_for_boxed_answer():
    msgs = build_messages({"problem": " What is $1+1$? ", "answer": "2"}, "Be careful.")
    assert msgs == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": f"What is $1+1$?\n\n{ANSWER_INSTRUCTION}"},
    ]
    assert r"\boxed{}" in ANSWER_INSTRUCTION
    assert [m["role"] for m in build_messages({"problem": "p"}, "")] == ["user"]


def test_switching_to_math_is_one_key():
    gsm8k = REPO_ROOT / "configs" / "gsm8k_grpo.yaml"
    assert load_config(gsm8k, ["data.task=math"]).data.task == "math"
    ours = yaml.safe_load((REPO_ROOT / "configs" / "math_grpo.yaml").read_text())
    theirs = yaml.safe_load(gsm8k.read_text())
    assert ours["data"] == {"task": "math"} and theirs["data"] == {"task": "gsm8k"}
    assert load_config(REPO_ROOT / "configs" / "math_grpo.yaml").data.task == "math"
