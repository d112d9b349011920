"""grpo.tasks.runner: reward calls on a pool of threads, each within a time limit.

The overlap tests use a barrier that only `n` calls running at once can pass, not wall-clock
speed-ups, so a loaded machine cannot fail them; the hung calls wait on an Event that each test
sets at its end, which lets their abandoned threads finish."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from grpo.config import ConfigError, load_config
from grpo.tasks import RewardHangError, RewardRunner, score
from grpo.tasks.runner import CLOSE_WAIT_S, TIMEOUT
from tests.conftest import REPO
from tests.rewards_for_tests import always_raises, digit_fraction


def length_reward(completion: str, row: dict) -> tuple[float, dict]:
    """Later calls finish first (shorter sleeps), so arrival order differs from call order."""
    time.sleep(0.01 * row["sleep"])
    return len(completion) / 10, {"index": row["index"], "formatted": len(completion) > 3}


def meet(n: int, wait_s: float):
    """A reward that returns only once `n` calls are inside it at the same time."""
    barrier = threading.Barrier(n)

    def reward(completion: str, row: dict) -> float:
        barrier.wait(wait_s)  # BrokenBarrierError (a reward_error) if fewer run at once
        return 1.0

    return reward


def hangs_on(word: str, release: threading.Event):
    """A reward that never returns on the answer `word` (until `release` is set)."""

    def reward(completion: str, row: dict) -> tuple[float, dict]:
        if completion == word:
            release.wait()
        return 1.0, {"formatted": True}

    return reward


@pytest.fixture
def release():
    """The Event hung rewards wait on; set after the test so their threads end."""
    event = threading.Event()
    yield event
    event.set()


def _calls(n: int) -> list[tuple[str, dict]]:
    return [("x" * (i + 1), {"index": i, "sleep": n - i}) for i in range(n)]


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_results_are_in_call_order_and_equal_scoring_one_by_one(workers):
    calls = _calls(8)
    expected = [score(length_reward, c, r) for c, r in calls]
    with RewardRunner(length_reward, workers=workers, timeout_s=30) as runner:
        assert runner.score_all(calls) == expected
        assert runner.score_all(calls) == expected  # the pool is reused
        assert runner.score_all([]) == []
    assert [info["index"] for _, info in expected] == list(range(8))


def test_calls_run_at_once_up_to_workers():
    with RewardRunner(meet(4, 30), workers=4, timeout_s=30) as runner:
        assert runner.score_all([("a", {})] * 4) == [(1.0, {})] * 4
    # The control: one worker cannot hold two calls at once, so the barrier breaks.
    with RewardRunner(meet(2, 0.2), workers=1, timeout_s=30) as runner:
        out = runner.score_all([("a", {})] * 2)
    assert all(
        reward == 0.0 and "BrokenBarrierError" in info["reward_error"] for reward, info in out
    )


def test_a_hung_call_times_out_the_others_score_and_the_pool_goes_on(release, caplog):
    barrier = threading.Barrier(4)

    def reward(completion: str, row: dict) -> tuple[float, dict]:
        if completion == "hang":
            release.wait()
        if completion == "meet":  # passes only with four calls running at once
            barrier.wait(10)
        return 1.0, {"formatted": True}

    ok = (1.0, {"formatted": True})
    calls = [("a", {}), ("hang", {}), ("b", {}), ("c", {})]
    with RewardRunner(reward, workers=4, timeout_s=0.5) as runner:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="grpo.reward"):
            out = runner.score_all(calls)
        elapsed = time.monotonic() - t0
        assert out == [ok, (0.0, {"reward_error": TIMEOUT}), ok, ok]
        assert 0.5 <= elapsed < 10
        (warning,) = [r.getMessage() for r in caplog.records if "did not return" in r.getMessage()]
        assert "test_a_hung_call_times_out" in warning and "within 0.5 s" in warning
        assert runner.timeouts == 1 and runner.stuck == 1

        # The stuck thread was replaced: four calls still run at once, and a hang in the next
        # batch times out as well.
        assert runner.score_all([("meet", {})] * 4) == [ok] * 4
        assert runner.score_all([("hang", {}), ("d", {})]) == [(0.0, {"reward_error": TIMEOUT}), ok]
        assert runner.timeouts == 2 and runner.stuck == 2

        release.set()  # the hung calls return: their results are dropped, their threads end
        deadline = time.monotonic() + 10
        while runner.stuck and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runner.stuck == 0
        assert runner.score_all(calls) == [ok] * 4


def test_a_timed_out_worker_is_replaced_within_the_batch(release):
    """Two workers: one hangs; the other naps, then holds the first "meet" at a barrier for
    two. Only a worker started in the hung one's place (at 1.5 s) can run the second "meet"
    before the first one's own limit (at 0.75 + 1.5 s) and let both pass."""
    barrier = threading.Barrier(2)

    def reward(completion: str, row: dict) -> float:
        if completion == "hang":
            release.wait()
        elif completion == "nap":
            time.sleep(0.75)
        else:
            barrier.wait(10)
        return 1.0

    with RewardRunner(reward, workers=2, timeout_s=1.5) as runner:
        out = runner.score_all([("hang", {}), ("nap", {}), ("meet", {}), ("meet", {})])
    assert out == [(0.0, {"reward_error": TIMEOUT}), (1.0, {}), (1.0, {}), (1.0, {})]


def test_the_timeout_counts_from_the_start_of_each_call():
    """Six 0.25 s calls on one worker take 1.5 s, past the 1 s limit, yet none times out."""

    def slow(completion: str, row: dict) -> float:
        time.sleep(0.25)
        return 0.5

    with RewardRunner(slow, workers=1, timeout_s=1.0) as runner:
        t0 = time.monotonic()
        assert runner.score_all([("a", {})] * 6) == [(0.5, {})] * 6
        assert time.monotonic() - t0 >= 1.5 and runner.timeouts == 0


def test_errors_score_zero_with_reward_error_as_score_reports_them():
    def not_finite(completion: str, row: dict) -> float:
        return float("nan")

    calls = [("12ab", {}), ("boom", {}), ("nan", {})]

    def mixed(completion: str, row: dict):
        fn = {"boom": always_raises, "nan": not_finite}.get(completion, digit_fraction)
        return fn(completion, row)

    with RewardRunner(mixed, workers=3, timeout_s=30) as runner:
        out = runner.score_all(calls)
    assert out[0] == digit_fraction("12ab", {})
    assert out[1] == (0.0, {"reward_error": "RuntimeError: boom"})
    assert out[2][0] == 0.0 and out[2][1]["reward_error"].startswith("ValueError: ")


def test_what_score_lets_through_reaches_the_caller():
    def exits(completion: str, row: dict) -> float:
        raise SystemExit(3)

    with RewardRunner(exits, workers=2, timeout_s=30) as runner, pytest.raises(SystemExit):
        runner.score_all([("a", {}), ("b", {})])


def test_close_returns_at_once_with_a_hung_call(release, caplog):
    runner = RewardRunner(hangs_on("hang", release), workers=3, timeout_s=0.2)
    assert runner.score_all([("hang", {}), ("a", {})])[0][1] == {"reward_error": TIMEOUT}
    idle = [t for t in threading.enumerate() if t.name.startswith("reward-") and t.daemon]
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="grpo.reward"):
        runner.close()
    assert time.monotonic() - t0 < CLOSE_WAIT_S + 1
    assert "1 call(s) past their timeout are still running" in caplog.text
    assert sum(t.is_alive() for t in idle) == 1  # the stuck one; the idle workers ended
    runner.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        runner.score_all([("a", {})])


def test_too_many_stuck_calls_stop_with_an_error_naming_the_function(release):
    runner = RewardRunner(hangs_on("hang", release), workers=2, timeout_s=0.2, max_stuck=1)
    with runner, pytest.raises(RewardHangError, match=r"hangs_on.<locals>.reward: 2 calls"):
        runner.score_all([("hang", {}), ("hang", {})])


def test_bad_arguments_are_refused():
    for kwargs in ({"workers": 0}, {"timeout_s": 0}, {"timeout_s": float("inf")}):
        with pytest.raises(ValueError):
            RewardRunner(digit_fraction, **kwargs)


def test_a_process_whose_reward_spins_forever_still_exits():
    """A pure-Python infinite loop keeps the GIL moving: it times out, and the process exits
    although its thread never ends (a ThreadPoolExecutor's would be joined at exit: a hang)."""
    script = textwrap.dedent(
        """
        from grpo.tasks import RewardRunner

        def spin(completion, row):
            while completion:
                pass

        with RewardRunner(spin, workers=2, timeout_s=0.3) as runner:
            print(runner.score_all([("x", {}), ("", {})]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "[(0.0, {'reward_error': 'timeout'}), (0.0, {'reward_error': 'TypeError:" in done.stdout


@pytest.mark.parametrize(
    "override, message",
    [
        ("reward.timeout_s=0", "reward.timeout_s must be a finite number > 0, got 0.0"),
        ("reward.timeout_s=.inf", "reward.timeout_s must be a finite number, got inf"),
        ("reward.workers=0", "reward.workers must be >= 1, got 0"),
        ("reward.workers=1.5", "reward.workers must be int, got 1.5"),
    ],
)
def test_reward_config_errors_are_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == message
    cfg = load_config(None, ["reward.timeout_s=2", "reward.workers=1"])
    assert (cfg.reward.timeout_s, cfg.reward.workers) == (2.0, 1)
    assert (load_config(None).reward.timeout_s, load_config(None).reward.workers) == (60.0, 4)


class _Tokenizer:
    """Decodes a completion of token ids to 'a' * id, so each answer's text names its id."""

    pad_token_id = 0

    def batch_decode(self, ids, skip_special_tokens: bool) -> list[str]:
        return ["a" * int(seq[0]) for seq in ids]


class _Engine:
    """Answers prompt k with completion ids [k * n + j + 1] for j < n."""

    stop_event = threading.Event()

    def generate(self, prompts, sampling):
        from grpo.rollout.base import Generation

        n = sampling.n
        return [
            Generation(p, np.array([k * n + j + 1, 2], dtype=np.int32), "stop")
            for k, p in enumerate(prompts)
            for j in range(n)
        ]


def test_batch_maker_scores_through_the_runner_and_timeouts_reach_the_metrics(release):
    """A BatchMaker (log-probs on the trainer: no model) whose reward hangs on one answer: that
    answer scores 0 with reward_error 'timeout', the rest score, and the info crosses the wire
    into the trainer's reward_timeouts."""
    from grpo.sampler.data import Prompt
    from grpo.sampler.episodes import BatchMaker
    from grpo.trainer.outputs import batch_metrics
    from grpo.wire.codec import decode, encode_batch

    cfg = load_config(None, ["train.logprobs_on=trainer", "rollout.questions_per_step=2",
                             "rollout.group_size=3", "reward.workers=3"])  # fmt: skip
    prompts = [Prompt(i, {"q": i}, np.array([5, 6], dtype=np.int32)) for i in (7, 9)]
    shard = SimpleNamespace(position=0, draw=lambda: prompts)
    weights = SimpleNamespace(version=0, reload_s=0.0)

    def reward(completion: str, row: dict) -> tuple[float, dict]:
        if len(completion) == 5:  # the second question's second answer
            release.wait(30)  # a bound: scored one by one, without the runner, it would score
        return len(completion) / 10, {"correct": row["q"] == 7, "formatted": True}

    with RewardRunner(reward, cfg.reward.workers, timeout_s=0.5) as runner:
        maker = BatchMaker(cfg, _Tokenizer(), runner, shard, weights)
        batch = maker.make(0, _Engine())
    got = [(e.group_id, e.reward, e.reward_info) for e in batch.episodes]
    assert got == [
        (7, 0.1, {"correct": True, "formatted": True}),
        (7, 0.2, {"correct": True, "formatted": True}),
        (7, 0.3, {"correct": True, "formatted": True}),
        (9, 0.4, {"correct": False, "formatted": True}),
        (9, 0.0, {"reward_error": "timeout"}),
        (9, 0.6, {"correct": False, "formatted": True}),
    ]
    received = decode(encode_batch(batch))
    assert received.episodes[4].reward_info == {"reward_error": "timeout"}
    metrics = batch_metrics(received)
    assert (metrics["reward_errors"], metrics["reward_timeouts"]) == (1, 1)
