"""Tests for grpo.tasks: registry, reward loading/scoring, dataset loading, GSM8K grading."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import types

import pytest

from grpo.tasks import (
    REPO_ROOT,
    Task,
    get_task,
    load_reward_fn,
    load_rows,
    register_task,
    score,
    task_names,
)
from grpo.tasks import base as tasks_base
from grpo.tasks.gsm8k import (
    ANSWER_INSTRUCTION,
    FORMAT_REWARD,
    build_messages,
    extract_answer,
    is_correct,
    normalize_number,
    parse_gold,
    reward,
    working_result,
)

GSM8K_TRAIN = REPO_ROOT / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(autouse=True)
def fresh_failure_count(monkeypatch):
    """A reward failure's line is logged the first ten times in a process (then at each power
    of two): each test counts from zero, whatever ran before it in this worker."""
    monkeypatch.setattr(tasks_base, "_failures", 0)


@pytest.fixture
def repo_on_path(monkeypatch):
    """Make ``tests.rewards_for_tests`` importable however pytest was launched."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))


# ---------------------------------------------------------------------------
# GSM8K: answer extraction and normalisation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so she has 18 left.\n#### 18", "18"),
        ("reasoning...\n####18", "18"),
        ("The answer is <answer>18</answer>", "18"),
        ("<answer> $18 </answer>", "18"),
        ("<ANSWER>\nShe earns 18 dollars.\n</ANSWER>", "18"),
        (r"Thus \boxed{18}.", "18"),
        (r"\boxed{\$18}", "18"),
        (r"\boxed{18\%}", "18"),
        (r"\boxed{\$1,000}", "1000"),
        (r"\boxed{\frac{3}{4}}", "0.75"),
        ("#### **1,234.00**.", "1234"),
        ("#### -3 apples", "-3"),
    ],
)
def test_extract_answer_formats(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### 1\n<answer>2</answer>\n\\boxed{3}", "3"),
        ("\\boxed{3}\n<answer>2</answer>\n#### 1", "1"),
        ("<answer>2</answer> then #### 5\nwait, actually <answer>7</answer>", "7"),
        ("#### 4\nfinal: #### 9", "9"),
        # A later marker without a number does not hide an earlier valid one.
        ("#### 12\n<answer>unsure</answer>", "12"),
    ],
)
def test_extract_answer_last_occurrence_wins(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The answer is 18.",  # no explicit marker: no last-number fallback
        "18",
        "#### <number>",
        "<answer></answer>",
        r"\boxed{}",
        "#### Step 2: add 5 apples",  # a markdown heading, not an answer line
        "<answer>18",  # unclosed tag
    ],
)
def test_extract_answer_none_when_absent(text):
    assert extract_answer(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#### Step 2: #### 5", "5"),  # a later marker on the heading's line still counts
        ("#####  7", "7"),
        ("####\t $ -4", "-4"),
        ("<answer>a</answer><ANSWER>3</answer>", "3"),
        ("<answer>1</answer> <answer> no close", "1"),
        (r"\boxed{\boxed{6}}", "6"),  # nested: the innermost
        (r"\boxed{5 \boxed{x}} \boxed{", None),  # an enclosing box is not read again
        (r"} \boxed{2} {", "2"),
    ],
)
def test_extract_answer_edge_cases(text, expected):
    assert extract_answer(text) == expected


# Inputs a model can write that made the old patterns backtrack: each `n` characters long.
ADVERSARIAL = {
    "#### then blanks": lambda n: "####" + " " * (n - 4),
    "unclosed answer tags": lambda n: "<answer>" * (n // 8),
    "unclosed boxes": lambda n: "\\boxed{" * (n // 7),
    "nested boxes": lambda n: "\\boxed{" * (n // 16) + "\\boxed{z}" + "}" * (n // 16),
}


@pytest.mark.parametrize("make", ADVERSARIAL.values(), ids=list(ADVERSARIAL))
def test_answer_extraction_is_linear_on_adversarial_text(make):
    """finding 5: GSM8K's `####` pattern was quadratic on `####` plus blanks (1.4 s at 8,000
    characters), `<answer>` tags without a close and `\\boxed{` without one rescanned the
    text once per opening. The answer is still found after such text, and the work grows
    linearly: Python lines counted (exact), regex time compared on 1k and 8k characters."""
    from tests.growth import FACTOR, LINEAR_BOUND, line_events, time_growth

    assert extract_answer(make(8000)) is None
    assert extract_answer(make(8000) + "\n#### 42") == "42"
    small, large = line_events(extract_answer, make(500)), line_events(extract_answer, make(4000))
    assert large <= FACTOR * small * 1.2 + 50, (small, large)
    assert time_growth(extract_answer, make, 1000) < LINEAR_BOUND


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,234", "1234"),
        ("1234", "1234"),
        ("$18.00", "18"),
        ("18 dollars", "18"),
        ("5 apples", "5"),
        ("3 cm", "3"),
        ("-3", "-3"),
        ("+7", "7"),
        ("2.50", "2.5"),
        ("18.", "18"),
        ("  42  ", "42"),
        ("50%", "50"),
        ("€5", "5"),
        ("£1,000,000", "1000000"),
        ("3/4", "0.75"),
        ("1/3", normalize_number(str(1 / 3))),
        ("-0.0", "0"),
        ("100", "100"),
        (r"\$1,000", "1000"),
        ("1{,}000", "1000"),
        ("−4", "-4"),  # unicode minus
    ],
)
def test_normalize_number(raw, expected):
    assert normalize_number(raw) == expected


@pytest.mark.parametrize("raw", ["", "abc", "$", "1/0", "dollars"])
def test_normalize_number_none(raw):
    assert normalize_number(raw) is None


def test_boxed_with_escaped_dollar_and_thousands():
    assert extract_answer(r"So the total is \boxed{\$1,000}.") == "1000"


# ---------------------------------------------------------------------------
# GSM8K: grading and reward
# ---------------------------------------------------------------------------

RAW_GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"


def test_parse_gold():
    assert parse_gold(RAW_GOLD) == "1072"
    assert parse_gold("blah\n#### -5") == "-5"
    with pytest.raises(ValueError, match="####"):
        parse_gold("no marker here 12")


def test_parse_gold_all_train_rows():
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines() if line.strip()]
    assert len(rows) == 7473
    golds = [parse_gold(r["answer"]) for r in rows]
    assert all(g and g.lstrip("-").replace(".", "").isdigit() for g in golds)


def work(result: str = "1,072") -> str:
    """Working enough for the built-in rewards' rules (grpo.tasks.answer_form.MIN_WORKING_WORDS)
    that arrives at `result` (gsm8k.working_result)."""
    return f"She sold 48 in April and 1,024 in May, so 48 + 1,024 = {result} in all.\n"


WORK = work()


def test_is_correct_with_raw_gold_and_plain_number():
    assert is_correct(WORK + "#### 1072", RAW_GOLD)
    assert is_correct(WORK + "<answer>$1,072.00</answer>", RAW_GOLD)
    assert not is_correct(WORK + "#### 1071", RAW_GOLD)
    assert not is_correct(WORK + "The answer is 1072", RAW_GOLD)  # unformatted
    assert is_correct(work("2.5") + r"\boxed{2.5}", "2.50")
    assert is_correct(work("18") + "#### 18", "18")
    assert not is_correct(work("18") + "#### 18", "19")
    assert not is_correct("#### 18", "18")  # no working: no credit, right number or not


def test_reward_values_and_info():
    row = {"question": "q", "answer": RAW_GOLD}

    value, info = reward(WORK + "#### 1072", row)
    assert value == 1.0
    assert info == {"formatted": True, "correct": True, "pred": "1072", "gold": "1072",
                    "markers": 1, "reward/format": 0.1, "reward/answer": 0.9}  # fmt: skip

    value, info = reward(work("7") + "#### 7", row)
    assert value == FORMAT_REWARD == 0.1
    assert info == {"formatted": True, "correct": False, "pred": "7", "gold": "1072",
                    "markers": 1, "reward/format": 0.1, "reward/answer": 0.0}  # fmt: skip

    value, info = reward("I think it is 1072", row)
    assert value == 0.0
    assert info == {"formatted": False, "correct": False, "pred": None, "gold": "1072",
                    "markers": 0, "reward/format": 0.0, "reward/answer": 0.0}  # fmt: skip


# What the CPU demo learned under "0.1 for any parseable #### N" (issue 58): each holds a
# parseable answer, and none is a worked one.
SPAM = {
    "the answer twenty times": ("#### 2\n" * 20, "20 answer markers"),
    "markers glued to the number": ("#### 22.####.####.####...", "4 answer markers"),
    "markers doubled": ("######## 7\n##### 11\n##### 11", "4 answer markers"),
    "a tail of hashes": (WORK + "#### 6#####", "2 answer markers"),
    "the answer quoted again": (WORK + '#### 50\nThe answer is "#### 50".', "2 answer markers"),
    "the answer alone": ("#### 1072", "no working before the answer"),
    "no working, a phrase": ("The answer is\n#### 1072", "no working before the answer"),
    "more after the answer": (WORK + "#### 1072\nSo she sold 1072 clips.", "text after the answer"),
    "a long tail on its line": (WORK + "#### 1072 as 48 + 24 is 72 clips", "text after the answer"),
    "a looping working": ((WORK * 3) + "#### 1072", "repeats itself"),
    "a boxed answer twice": (WORK + r"\boxed{1072} \boxed{1072}", "2 answer markers"),
}
# What it learned once spam earned nothing: plausible working, then a number the working never
# arrived at (the demo's last evaluation, 2026-12-02; the first two quoted whole).
NOT_ARRIVED_AT = {
    "another number": "James decides to run 3 sprints a week. He runs 60 meters each sprint. He "
    "runs 3 * 60 = 180 meters.\n#### 11",
    "a part of the result": "Josh bought a house for $80,000 and put it into a new home for "
    "$50,000. The house now has a value of $80,000 + $50,000 = $150,000.\n#### 150",
    "an operand of the last sum": "He runs 60 meters each sprint, so he runs 3 * 60 = 180 meters."
    "\n#### 3",
    "a result of an earlier sentence": "He runs 3 * 60 = 180 meters. He runs that on 2 days of the "
    "week.\n#### 180",
    "no number in the working": "She had six boxes of seven pens each, so she had\n#### 42",
}
SPAM |= {case: (text, "final number not in the working's last result")
         for case, text in NOT_ARRIVED_AT.items()}  # fmt: skip


@pytest.mark.parametrize("case", list(SPAM))
def test_answer_spam_earns_nothing_and_says_why(case):
    text, why = SPAM[case]
    value, info = reward(text, {"question": "q", "answer": RAW_GOLD})
    assert (value, info["formatted"], info["correct"]) == (0.0, False, False)
    assert info["pred"] is not None and info["refused"] == why


@pytest.mark.parametrize(
    "text",
    [
        WORK + "#### 1072",
        WORK + "#### $1,072.00",
        WORK + "#### 1072 clips",
        "#### Step 1\nAdd them up.\n#### Step 2\n" + WORK + "#### 1072",  # headings: no marker
        WORK + r"So she sold $\boxed{1072}$.",
        WORK + "\\[\n\\boxed{1072}\n\\]",
        WORK + "<answer>1072</answer>\n",
    ],
)
def test_a_worked_answer_earns_full_credit(text):
    assert reward(text, {"question": "q", "answer": RAW_GOLD})[0] == 1.0


@pytest.mark.parametrize(
    ("working", "result"),
    [
        ("He runs 3 * 60 = 180 meters.", {"180"}),
        ("She makes 9 * 2 = $18 every day, 2.5 times more.", {"18", "2.5"}),
        ("So 24/240 = $0.10 a wash.\nThat is all", {"0.1"}),
        ("It took three days. That is 3 days!\n", {"3"}),
        ("Nothing numbered here.", set()),
    ],
)
def test_working_result_is_the_last_numbered_sentence_s_results(working, result):
    assert working_result(working) == result


def test_gsm8k_s_own_solutions_arrive_at_their_answers():
    """The rules must not refuse answers written as GSM8K's solutions are (each train solution
    as a completion, calculator annotations and all): 98.6 % earn full credit, and the rule
    that the final number is the working's result refuses 0.75 % (a "$0.25" read as 25)."""
    rows = [json.loads(line) for line in GSM8K_TRAIN.read_text().splitlines() if line.strip()]
    infos = [reward(row["answer"], row)[1] for row in rows]
    assert sum(info["correct"] for info in infos) / len(rows) >= 0.98
    not_arrived = [info.get("refused") == SPAM["another number"][1] for info in infos]
    assert sum(not_arrived) / len(rows) <= 0.01


def test_working_result_is_linear():
    from tests.growth import LINEAR_BOUND, time_growth

    def make(n: int) -> str:
        return "= 1 " * (n // 4)

    assert working_result(make(8000)) == {"1"}
    assert time_growth(working_result, make, 1000) < LINEAR_BOUND


def test_reward_through_score_is_msgpack_friendly():
    value, info = score(reward, work("3") + "#### 3", {"question": "q", "answer": "#### 3"})
    assert value == 1.0
    assert all(isinstance(v, str | int | float | bool | type(None)) for v in info.values())


def test_build_messages_with_and_without_system_prompt():
    row = {"question": "  How many apples?  ", "answer": "#### 3"}
    msgs = build_messages(row, "You are a careful solver.")
    assert msgs == [
        {"role": "system", "content": "You are a careful solver."},
        {"role": "user", "content": f"How many apples?\n\n{ANSWER_INSTRUCTION}"},
    ]
    assert ANSWER_INSTRUCTION == 'Give the final answer on its own line as "#### <number>".'
    msgs = build_messages(row, "")
    assert [m["role"] for m in msgs] == ["user"]


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def test_get_gsm8k_task():
    task = get_task("gsm8k")
    assert "gsm8k" in task_names()
    assert task.name == "gsm8k"
    assert task.reward is reward
    assert task.default_train == "data/gsm8k/train.jsonl"
    assert task.default_test == "data/gsm8k/test.jsonl"


def test_unknown_task_lists_names_and_suggests():
    with pytest.raises(ValueError) as err:
        get_task("gsm8kk")
    msg = str(err.value)
    assert "unknown task 'gsm8kk'" in msg and "valid: addition, arithmetic, gsm8k, math" in msg
    assert "did you mean 'gsm8k'" in msg and "'package.module:name'" in msg


def test_unknown_task_without_close_match():
    with pytest.raises(ValueError, match="valid: .*gsm8k") as err:
        get_task("zzzzzzzz")
    assert "did you mean" not in str(err.value)


def test_duplicate_registration_raises():
    original = get_task("gsm8k")
    clone = Task(
        name="gsm8k",
        load=original.load,
        build_messages=original.build_messages,
        reward=lambda c, r: 0.0,
        default_train="x.jsonl",
        default_test="y.jsonl",
    )
    with pytest.raises(ValueError, match="already registered"):
        register_task(clone)
    assert get_task("gsm8k") is original  # not overwritten


def test_register_new_task(monkeypatch):
    monkeypatch.setattr(tasks_base.TASKS, "_entries", dict(tasks_base.TASKS._entries))
    task = Task("toy", load_rows, build_messages, lambda c, r: 1.0, "a.jsonl", "b.jsonl")
    assert register_task(task) is task
    assert get_task("toy") is task
    assert task_names() == sorted(["addition", "arithmetic", "gsm8k", "math", "prompts", "toy"])


def test_tasks_are_frozen():
    with pytest.raises(AttributeError):
        get_task("gsm8k").name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------
# Custom rewards and score()
# ---------------------------------------------------------------------------


def test_load_reward_fn(repo_on_path):
    fn = load_reward_fn("tests.rewards_for_tests:digit_fraction")
    value, info = score(fn, "ab12", {})
    assert value == 0.5
    assert info == {"formatted": False, "correct": False, "length": 4}
    assert score(fn, "", {}) == (0.0, {"formatted": False, "correct": False, "length": 0})


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("tests.rewards_for_tests", "package.module:name"),
        ("tests.rewards_for_tests:", "package.module:name"),
        (":digit_fraction", "package.module:name"),
        ("a:b:c", "package.module:name"),
        ("no_such_module_xyz:fn", "could not import reward module 'no_such_module_xyz'"),
        ("tests.rewards_for_tests:nope", "has no attribute 'nope'"),
        ("tests.rewards_for_tests:annotations", "not a callable"),
    ],
)
def test_load_reward_fn_bad_specs(repo_on_path, spec, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_reward_fn(spec)


def test_load_reward_fn_from_cwd_when_not_on_path(tmp_path, monkeypatch):
    # Console scripts don't put the cwd on sys.path; a reward file next to the user still loads.
    (tmp_path / "my_cwd_rewards_xyz.py").write_text("def fn(c, r):\n    return 2.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_cwd_rewards_xyz", raising=False)
    fn = load_reward_fn("my_cwd_rewards_xyz:fn")
    assert fn("", {}) == 2.0
    sys.modules.pop("my_cwd_rewards_xyz", None)


def test_score_with_raising_fn_logs_and_returns_zero(repo_on_path, caplog):
    fn = load_reward_fn("tests.rewards_for_tests:always_raises")
    with caplog.at_level(logging.WARNING, logger="grpo.reward"):
        value, info = score(fn, "text", {})
    assert value == 0.0
    assert info == {"reward_error": "RuntimeError: boom"}
    records = [r for r in caplog.records if r.name == "grpo.reward"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert "always_raises" in records[0].getMessage()
    assert "boom" in records[0].getMessage()


def test_a_reward_failing_on_every_answer_writes_a_bounded_number_of_lines(repo_on_path, caplog):
    """The first ten failures of a process and each power of two after, with the count."""
    fn = load_reward_fn("tests.rewards_for_tests:always_raises")
    with caplog.at_level(logging.WARNING, logger="grpo.reward"):
        for _ in range(200):
            assert score(fn, "text", {}) == (0.0, {"reward_error": "RuntimeError: boom"})
    lines = [r.getMessage() for r in caplog.records if r.name == "grpo.reward"]
    assert len(lines) == 14 and "(128 times in this process so far)" in lines[-1]


def test_score_float_and_tuple_returns():
    assert score(lambda c, r: 0.5, "", {}) == (0.5, {})
    assert score(lambda c, r: 1, "", {}) == (1.0, {})
    assert score(lambda c, r: True, "", {}) == (1.0, {})
    value, info = score(lambda c, r: (2, {"k": "v"}), "", {})
    assert (value, info) == (2.0, {"k": "v"})
    assert isinstance(value, float)


def test_score_coerces_info_values_to_scalars():
    value, info = score(lambda c, r: (1.0, {"ok": 1, "lst": [1, 2], 3: None}), "", {})
    assert info == {"ok": 1, "lst": "[1, 2]", "3": None}


@pytest.mark.parametrize(
    ("ret", "error_type"),
    [
        ("1.0", "TypeError"),
        (None, "TypeError"),
        ((1.0,), "TypeError"),
        ((1.0, "info"), "TypeError"),
        (math.nan, "ValueError"),
        ((math.inf, {}), "ValueError"),
    ],
)
def test_score_bad_return_values(ret, error_type, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo.reward"):
        value, info = score(lambda c, r: ret, "", {})
    assert value == 0.0
    assert info["reward_error"].startswith(f"{error_type}:")
    assert len(caplog.records) == 1


# ---------------------------------------------------------------------------
# Dataset loading
# ---------------------------------------------------------------------------

ROWS = [{"question": "1+1?", "answer": "#### 2"}, {"question": "2+2?", "answer": "#### 4"}]


def test_load_rows_jsonl(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS[:1]) + "\n\n  \n" + json.dumps(ROWS[1]))
    assert load_rows(str(path)) == ROWS


def test_load_rows_json(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS))
    assert load_rows(str(path)) == ROWS


def test_load_rows_json_must_be_list(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"rows": ROWS}))
    with pytest.raises(ValueError, match="list"):
        load_rows(str(path))


def test_load_rows_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert load_rows(str(path)) == ROWS


def test_load_rows_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_rows(str(missing))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_rows("data/does_not_exist.jsonl")


def test_load_rows_bad_json_line_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json}\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3"):
        load_rows(str(path))


def test_load_rows_non_object_line(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        load_rows(str(path))


def test_load_rows_empty(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        load_rows(str(path))


def test_load_rows_unsupported_suffix(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_rows(str(path))


def _fake_datasets(monkeypatch, load_dataset):
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_load_rows_hf_name_and_config(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return ROWS

    _fake_datasets(monkeypatch, load_dataset)
    assert load_rows("openai/gsm8k:main") == ROWS
    assert load_rows("openai/gsm8k", split="test") == ROWS
    assert load_rows("openai/gsm8k:main:test") == ROWS
    assert calls == [
        ("openai/gsm8k", "main", "train"),
        ("openai/gsm8k", None, "test"),
        ("openai/gsm8k", "main", "test"),
    ]


def test_load_rows_hf_failure_is_clear(monkeypatch):
    def load_dataset(name, config, split):
        raise ConnectionError("offline")

    _fake_datasets(monkeypatch, load_dataset)
    with pytest.raises(ValueError, match="could not load dataset 'org/name'") as err:
        load_rows("org/name")
    assert "local" in str(err.value) and "offline" in str(err.value)


def test_gsm8k_loader_defaults_resolve_from_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative defaults must still be found
    task = get_task("gsm8k")
    rows = task.load(task.default_test)
    assert len(rows) == 1319
    assert {"question", "answer"} <= rows[0].keys()


def test_gsm8k_loader_validates_keys(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="row 1 has no 'answer'"):
        get_task("gsm8k").load(str(path))


@pytest.mark.parametrize("name", ["arithmetic", "addition"])
def test_arithmetic_rows_are_generated_alike_every_time_and_test_is_held_out(name):
    from grpo.tasks import arithmetic

    task = get_task(name)
    sizes = arithmetic.SIZES if name == "arithmetic" else arithmetic.SUM_SIZES
    test, train = task.load("test"), task.load(f"train:{min(5000, sizes['train'])}")
    assert test == task.load("test") and len(test) == sizes["test"]
    assert not {r["question"] for r in test} & {r["question"] for r in train}
    assert len({r["question"] for r in train}) == len(train)
    assert task.load("train:3") == train[:3]  # a prefix of the split, not another draw
    for row in test[:50]:  # every gold answer is a worked one the GSM8K reward pays in full
        assert reward(row["answer"], row)[0] == 1.0
    for bad in ("valid", "test:0", "test:x", f"train:{sizes['train'] + 1}"):
        with pytest.raises(ValueError, match=name):
            task.load(bad)


def test_addition_is_one_step_sums_of_small_numbers():
    task = get_task("addition")
    for row in task.load("test"):
        a, b = map(int, re.findall(r"\d+", row["question"]))
        assert 2 <= a <= 20 and 2 <= b <= 9 and row["answer"].endswith(f"\n#### {a + b}")


@pytest.mark.parametrize("prompt", ["", "   ", [], [{"role": "system", "content": "be brief"}]])
def test_the_prompts_task_refuses_a_row_with_nothing_to_answer(tmp_path, prompt):
    """Issue 62: an empty prompt or chat (no user message) would have the model answer the
    chat template alone."""
    from grpo.tasks.prompts import load

    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"prompt": "What is 2 + 2?"}) + "\n" + json.dumps({"prompt": prompt})
    )
    with pytest.raises(ValueError, match="row 1: 'prompt' must be a non-empty string"):
        load(str(path))
