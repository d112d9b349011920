"""Rewards as users have them (grpo.tasks.conventions): a verl compute_score and a TRL batched
reward function named in data.reward, recognised by their signature (or declared), wrapped,
and run by the reward workers with the built-in rewards' time limit and error handling; each
gives the built-in GSM8K reward on the same answers. A short run with the TRL one over an HF
dataset directory."""

from __future__ import annotations

import time

import pytest

from grpo.tasks import RewardRunner, gsm8k, load_reward_fn, score
from grpo.tasks.conventions import TrlReward, VerlReward, style_of
from tests.test_user_data import answers_for, gsm8k_rows, run_two_steps, to_verl

VERL = "tests.test_user_rewards:verl_compute_score"
TRL = "tests.test_user_rewards:trl_gsm8k_reward"


# ----------------------------------------------------------- the users' functions, as they are


def verl_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """GSM8K's reward, verl-style: a dict with the score and what else it found."""
    assert data_source == "openai/gsm8k" and extra_info["split"] == "train"
    value, info = gsm8k.reward(solution_str, {"answer": ground_truth})
    return {"score": value, "pred": info["pred"], "acc": info["correct"], "skipped": [1, 2]}


def trl_gsm8k_reward(prompts, completions, answer, **kwargs):
    """GSM8K's reward, TRL-style: a batch in, one float per completion out."""
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        out.append(gsm8k.reward(text, {"answer": gold})[0])
    return out


# Rewards no built-in checker gives: every value in [FINGERPRINT_LOW, FINGERPRINT_LOW + 0.03]
# (GSM8K's are 0, 0.1 and 1), so a run's rewards show that the user's function scored each
# answer (tests/test_user_data.py's runs).
FINGERPRINT_LOW = 0.25


def fingerprint(text: str) -> float:
    return FINGERPRINT_LOW + 0.01 * (len(text) % 4)


def verl_fingerprint_score(data_source, solution_str, ground_truth, extra_info=None):
    """A verl compute_score that checks its arguments as verl passes them."""
    assert data_source == "openai/gsm8k" and extra_info["split"] == "train" and ground_truth
    return {"score": fingerprint(solution_str), "pred": None}


def trl_fingerprint_reward(prompts, completions, answer, **kwargs):
    """A TRL batched reward that checks it gets the batch's columns."""
    assert len(prompts) == len(completions) == len(answer) and all(answer)
    return [fingerprint(c) for c in completions]


def trl_sees(prompts, completions, answer):  # no **kwargs: only the columns it names
    return [float(len(prompts) == 1 and answer[0] == "7" and completions[0] == "x")]


def trl_shapes(prompts, completions, **kwargs):
    """1 when the completion has the prompt's shape: messages for a chat, as TRL passes them."""
    chat = isinstance(prompts[0], list)
    ok = completions[0] == ([{"role": "assistant", "content": "x"}] if chat else "x")
    return [float(ok)]


def trl_hangs(prompts, completions, **kwargs):
    time.sleep(60)


def trl_two_for_one(prompts, completions, **kwargs):
    return [1.0, 1.0]


def verl_plain(data_source, solution_str, ground_truth, extra_info):
    return float(solution_str == ground_truth)


# ------------------------------------------------------------------------------------- tests


def test_signatures_are_recognised_and_wrapped():
    assert style_of(verl_compute_score) == "verl" and style_of(trl_gsm8k_reward) == "trl"
    assert style_of(gsm8k.reward) == "row"
    assert isinstance(load_reward_fn(VERL), VerlReward)
    assert isinstance(load_reward_fn(TRL), TrlReward)
    plain = load_reward_fn("tests.rewards_for_tests:text_length")
    assert plain.__name__ == "text_length"  # grpo's own: as it is
    # Declared in data.reward: the convention the signature would not give.
    declared = load_reward_fn("trl:tests.test_user_rewards:trl_sees")
    assert isinstance(declared, TrlReward) and declared.fn is trl_sees
    assert load_reward_fn(VERL).__qualname__ == "verl_compute_score"  # named so in logs


def test_verl_compute_score_gives_the_gsm8k_rewards():
    rows = gsm8k_rows(6)
    verl_rows = to_verl(rows, "train")
    fn = load_reward_fn(VERL)
    for row, verl_row in zip(rows, verl_rows, strict=True):
        for answer in answers_for(row):
            mine, info = score(fn, answer, verl_row)
            assert mine == score(gsm8k.reward, answer, row)[0]
            assert set(info) == {"pred", "acc"}  # the dict's scalars, its list left out
    assert score(load_reward_fn("tests.test_user_rewards:verl_plain"), "3",
                 verl_rows[0] | {"reward_model": {"ground_truth": "3"}})[0] == 1.0  # fmt: skip
    reward, info = score(fn, "#### 1", {"prompt": "q"})
    assert reward == 0.0 and "reward_model.ground_truth" in info["reward_error"]


def test_trl_reward_gives_the_gsm8k_rewards_as_string_and_as_chat():
    rows = gsm8k_rows(6)
    fn = load_reward_fn(TRL)
    for row in rows:
        for prompt in (row["question"], [{"role": "user", "content": row["question"]}]):
            mine = {"prompt": prompt, "answer": row["answer"]}
            for answer in answers_for(row):
                assert score(fn, answer, mine) == (score(gsm8k.reward, answer, row)[0], {})
    sees = load_reward_fn("tests.test_user_rewards:trl_sees")
    assert score(sees, "x", {"prompt": "p", "answer": "7", "other": 1}) == (1.0, {})
    shapes = load_reward_fn("tests.test_user_rewards:trl_shapes")
    for prompt in ("p", [{"role": "user", "content": "p"}]):
        assert score(shapes, "x", {"prompt": prompt}) == (1.0, {})
    reward, info = score(load_reward_fn("tests.test_user_rewards:trl_two_for_one"), "x", {})
    assert reward == 0.0 and "a list of one reward" in info["reward_error"]


def test_wrapped_rewards_run_in_the_workers_with_the_same_limits():
    """Through RewardRunner as every run's rewards go: the same scores, and a TRL function that
    hangs is cut at the time limit, scored 0 with reward_error 'timeout', its worker replaced."""
    rows = gsm8k_rows(3)
    calls = [
        (a, r) for r in to_verl(rows, "train") for a in answers_for(rows[r["extra_info"]["index"]])
    ]
    expected = [score(gsm8k.reward, a, rows[r["extra_info"]["index"]])[0] for a, r in calls]
    with RewardRunner(load_reward_fn(VERL), workers=2, timeout_s=30) as runner:
        assert [reward for reward, _ in runner.score_all(calls)] == expected
    with RewardRunner(load_reward_fn("tests.test_user_rewards:trl_hangs"), workers=1,
                      timeout_s=0.5) as runner:  # fmt: skip
        assert runner.score_all([("x", {"prompt": "p"})]) == [(0.0, {"reward_error": "timeout"})]
        assert runner.counters.timeouts == 1 and runner.counters.replacements == 1


@pytest.mark.slow
def test_a_run_with_a_trl_reward_over_a_dataset_directory(tmp_path, tiny_model_dir):
    """GSM8K saved as an HF dataset directory (TRL's standard format: a prompt string, the
    answer column), scored by a TRL batched reward: every answer scored, no reward_error."""
    import datasets

    rows = [{"prompt": f"{r['question']}\n\n{gsm8k.ANSWER_INSTRUCTION}", "answer": r["answer"]}
            for r in gsm8k_rows(16)]  # fmt: skip
    datasets.DatasetDict(train=datasets.Dataset.from_list(rows)).save_to_disk(str(tmp_path / "d"))
    data = {"task": "prompts", "train": f"{tmp_path / 'd'}:train",
            "reward": "tests.test_user_rewards:trl_fingerprint_reward"}  # fmt: skip
    run_two_steps(tmp_path, tiny_model_dir, data)


# ----------------------------------------------------------- rewards that fail


def _rewards(spec: str, *overrides: str):
    from grpo.config import load_config
    from grpo.sampler.rewards import SamplerRewards
    from grpo.tasks import get_task

    cfg = load_config(None, [f"data.reward={spec}", "reward.workers=1", *overrides])
    return SamplerRewards(cfg, get_task("gsm8k"))


def test_a_reward_failing_on_most_answers_stops_the_sampler_naming_it_and_its_first_error():
    """Each failure scores 0.0 (one broken answer must not end a run); a reward that fails on
    more than reward.max_error_rate of the last answers stops the sampler instead of training
    the run on zeros, in one line naming the reward and the first error it raised."""
    from grpo.tasks.failures import RewardFailingError

    calls = [("x" * n, {}) for n in range(1, 41)]
    rewards = _rewards("tests.rewards_for_tests:raises_on_every_fourth")
    try:
        scored = rewards.score_all(calls)  # 10 of 40 fail: under the default 0.5
        assert sum(info.get("reward_error") is not None for _, info in scored) == 10
    finally:
        rewards.close()
    rewards = _rewards(
        "tests.rewards_for_tests:raises_on_every_fourth", "reward.max_error_rate=0.2"
    )
    try:
        expected = (
            r"^the reward tests.rewards_for_tests:raises_on_every_fourth failed on 10 of the last "
            r"40 answers \(reward.max_error_rate=0.2\); its first error: ValueError: no number "
            r"in the answer$"
        )
        with pytest.raises(RewardFailingError, match=expected):
            rewards.score_all(calls)
    finally:
        rewards.close()
    rewards = _rewards("tests.rewards_for_tests:raises_on_every_fourth")
    try:
        rewards.score_all(calls[:4])  # 1 of 4: too few answers to judge a rate on
    finally:
        rewards.close()
    # Issue 64, item 3: a reward failing on every answer stops at its first batch, whatever
    # the count (a 1-step smoke run of it ended "run complete" before).
    rewards = _rewards("tests.rewards_for_tests:always_raises")
    try:
        with pytest.raises(RewardFailingError, match="failed on 4 of the last 4 answers"):
            rewards.score_all(calls[:4])
    finally:
        rewards.close()


def test_a_reward_beyond_the_bound_on_every_answer_stops_the_sampler_as_one_that_raises():
    """A finite reward over the trainer's bound scores 0 with a reward_error
    (checked_rewards); on every answer it is a failing reward, counted as such."""
    from grpo.tasks.failures import RewardFailingError

    rewards = _rewards("tests.rewards_for_tests:beyond_the_bound")
    try:
        with pytest.raises(
            RewardFailingError,
            match="failed on 4 of the last 4 answers.*not a finite number within",
        ):
            rewards.score_all([("x" * n, {}) for n in range(1, 5)])
    finally:
        rewards.close()


def test_a_reward_with_the_wrong_signature_is_refused_when_loaded():
    expected = (
        r"^reward tests.rewards_for_tests:takes_one_argument takes \(completion\), which cannot "
        r"be called as fn\(completion, row\)"
    )
    with pytest.raises(ValueError, match=expected):
        load_reward_fn("tests.rewards_for_tests:takes_one_argument")
    with pytest.raises(ValueError, match=r"cannot be called as compute_score\(data_source"):
        load_reward_fn("verl:tests.rewards_for_tests:takes_one_argument")
    with pytest.raises(ValueError, match=r"cannot be called as fn\(prompts, completions"):
        load_reward_fn("trl:tests.rewards_for_tests:takes_one_argument")


def _results(errors: list[str | None]) -> list[tuple[float, dict]]:
    return [(0.0, {"reward_error": e} if e is not None else {}) for e in errors]


def test_the_error_rate_is_of_the_last_window_and_names_the_first_error():
    """The rate is over the last WINDOW answers, not the whole run (a reward that starts failing
    late must stop the run however many answers went well before), and the message names the
    run's first error, not the latest."""
    from grpo.tasks.failures import WINDOW, FailureRate, RewardFailingError

    assert WINDOW == 256
    rate = FailureRate("r", bound=0.5)
    rate.add(_results(["first"] * 90 + [None] * 110))  # 90 of 200: within the bound
    late = ["later"] * 130 + [None] * 126  # the last 256: 130 failed, over half
    with pytest.raises(RewardFailingError) as raised:
        rate.add(_results(late))  # over the whole run it is 220 of 456: under half
    assert str(raised.value) == (
        "the reward r failed on 130 of the last 256 answers (reward.max_error_rate=0.5); "
        "its first error: first"
    )


def test_the_rate_is_judged_from_exactly_the_least_answers_and_a_bound_of_one_allows_all():
    from grpo.tasks.failures import LEAST, FailureRate, RewardFailingError

    assert LEAST == 32
    rate = FailureRate("r", bound=0.5)
    rate.add(_results(["e"] * 16 + [None] * 15))  # 16 of 31: too few answers to judge
    with pytest.raises(RewardFailingError, match="failed on 17 of the last 32 answers"):
        rate.add(_results(["e"]))  # the 32nd answer: judged
    lone = FailureRate("r", bound=0.5)
    lone.add(_results(["e"]))  # a lone answer, failed: no batch to judge the reward by
    lone.add(_results(["e"]))
    with pytest.raises(RewardFailingError, match="failed on 4 of the last 4 answers"):
        lone.add(_results(["e", "e"]))  # a batch, and every answer so far failed
    anything = FailureRate("r", bound=1.0)  # reward.max_error_rate=1.0: never stop
    for _ in range(3):
        anything.add(_results(["e"] * 100))


def test_a_sampler_stopped_by_a_failing_reward_exits_2_and_is_not_restarted(tiny_model_dir):
    """The failure-rate stop is the user's reward failing, not a crash: a restart scores the
    same questions with the same function. The sampler raised it as an uncaught error (a
    traceback, exit 1), and launch.sh restarted it three times: a 1-step run of a reward that
    raised on every answer took minutes and three rotated run dirs to end with exit 1 (issue
    64's mistake table). One line naming the reward, and exit 2, which launch.sh never heals."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    stopped = "the reward my:score failed on 4 of the last 4 answers; its first error: KeyError"
    code = (
        "import sys\n"
        "import grpo.sampler.loop as loop\n"
        "from grpo.tasks.failures import RewardFailingError\n"
        "def run_sampler(cfg):\n"
        f"    raise RewardFailingError({stopped!r})\n"
        "loop.run_sampler = run_sampler\n"
        "from grpo.cli import main\n"
        "sys.exit(main('sampler', sys.argv[1:]))\n"
    )
    args = [f"model.path={tiny_model_dir}", "rollout.backend=hf", "data.task=addition"]
    out = subprocess.run(
        [sys.executable, "-c", code, str(repo / "configs" / "cpu_demo.yaml"), *args],
        cwd=repo, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2, (out.returncode, lines[-5:])
    assert len(lines) == 1 and stopped in lines[0] and "Traceback" not in out.stderr, lines


def test_samplers_stopped_by_their_reward_end_the_trainer_with_exit_2_too():
    """Row 28 of issue 64's mistake table: the trainer ended with exit 1 ("no sampler left")
    before its sampler's exit 2 reached launch.sh, which restarted the trainer. A sampler
    stopped by the run's input says so in its stop, and the trainer's exit is then 2."""
    from grpo.trainer.process import peer_error_exit
    from grpo.wire import messages
    from grpo.wire.channels import PeerError

    said = f"sampler sampler-0 stopped: {messages.INPUT_STOPPED}: the reward my:score failed"
    assert peer_error_exit(PeerError(f"no sampler left: {said}")) == 2
    assert peer_error_exit(PeerError("no sampler left: sampler sampler-0 stopped: crashed")) == 1


def test_a_sampler_stopped_by_a_failing_reward_tells_the_trainer_so():
    from grpo.sampler.loop import stop_reason
    from grpo.tasks.failures import RewardFailingError
    from grpo.trainer.process import peer_error_exit
    from grpo.wire.channels import PeerError

    said = stop_reason(RewardFailingError("the reward my:score failed on 4 of the last 4"))
    assert peer_error_exit(PeerError(f"no sampler left: sampler sampler-0 stopped: {said}")) == 2
    assert stop_reason(KeyError("x")) == "crashed: KeyError: 'x'"
