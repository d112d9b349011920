"""grpo.tasks.runner: reward calls in a pool of worker processes, each within a time limit; a
worker past it is killed and replaced, whatever it is stuck in.

The rewards are in tests/rewards_for_tests.py (a worker imports them by name). The overlap
tests use a barrier in the file system that only `n` calls running at once can pass, not
wall-clock speed-ups, so a loaded machine cannot fail them."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from grpo.config import ConfigError, load_config
from grpo.tasks import (
    RewardHangError,
    RewardRunner,
    RewardWorkerError,
    RunnerCounters,
    score,
)
from grpo.tasks.runner import CLOSE_WAIT_S, TIMEOUT
from tests.conftest import REPO
from tests.orphans import kill_if_running, running, wait_until
from tests.rewards_for_tests import digit_fraction, hangs_on_five, length_reward, scripted

OK = (1.0, {"formatted": True})
TIMED_OUT = (0.0, {"reward_error": TIMEOUT})


def _calls(n: int) -> list[tuple[str, dict]]:
    return [("x" * (i + 1), {"index": i, "sleep": n - i}) for i in range(n)]


def _meeting(tmp_path, n: int, wait_s: float = 30.0) -> dict:
    """The row of a "meet" call: it passes once `n` calls are inside at once."""
    folder = tmp_path / f"meet-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    return {"dir": str(folder), "n": n, "wait_s": wait_s}


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_results_are_in_call_order_and_equal_scoring_one_by_one(workers):
    calls = _calls(8)
    expected = [score(length_reward, c, r) for c, r in calls]
    with RewardRunner(length_reward, workers=workers, timeout_s=30) as runner:
        assert runner.score_all(calls) == expected
        assert runner.score_all(calls) == expected  # the pool is reused
        assert runner.score_all([]) == []
        assert runner.counters == RunnerCounters(calls=16)
    assert [info["index"] for _, info in expected] == list(range(8))


def test_calls_run_at_once_up_to_workers(tmp_path):
    with RewardRunner(scripted, workers=4, timeout_s=30) as runner:
        assert runner.score_all([("meet", _meeting(tmp_path, 4))] * 4) == [OK] * 4
    # The control: one worker cannot hold two calls at once, so the barrier breaks.
    with RewardRunner(scripted, workers=1, timeout_s=30) as runner:
        out = runner.score_all([("meet", _meeting(tmp_path, 2, wait_s=0.2))] * 2)
    assert all(reward == 0.0 and "fewer than 2" in info["reward_error"] for reward, info in out)


def test_a_hung_call_times_out_the_others_score_and_the_pool_goes_on(tmp_path, caplog):
    calls = [("a", {}), ("hang", {}), ("b", {}), ("c", {})]
    # A limit of seconds, not tenths: the quick calls must finish within it while the CI's
    # other worker loads both cores (at 0.5 s a quick call timed out there).
    with RewardRunner(scripted, workers=4, timeout_s=3) as runner:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="grpo.reward"):
            out = runner.score_all(calls)
        elapsed = time.monotonic() - t0
        assert out == [OK, TIMED_OUT, OK, OK]
        assert 3 <= elapsed < 30
        (warning,) = [r.getMessage() for r in caplog.records if "did not return" in r.getMessage()]
        assert "rewards_for_tests:scripted" in warning and "within 3 s" in warning
        # The killed worker was replaced at once: the pool is whole for the next batch.
        assert runner.counters == RunnerCounters(calls=4, timeouts=1, kills=1, replacements=1)
        assert len(runner.pids()) == 4

        # Four calls still run at once, and a hang in the next batch times out as well.
        assert runner.score_all([("meet", _meeting(tmp_path, 4))] * 4) == [OK] * 4
        assert runner.score_all([("hang", {}), ("d", {})]) == [TIMED_OUT, OK]
        assert runner.counters == RunnerCounters(calls=10, timeouts=2, kills=2, replacements=2)


@pytest.mark.parametrize("stuck", ["regex", "spin"])
def test_a_call_stuck_in_c_holding_the_gil_times_out(stuck):
    """finding 5 and item 4: a catastrophic regex holds the GIL in one C call; with rewards on
    threads, no thread (the one timing it included) ran until it returned (2^64 steps here:
    never), and the heartbeats stopped with them. In a worker process it is killed at its limit."""
    with RewardRunner(scripted, workers=2, timeout_s=1.0) as runner:
        assert runner.score_all([(stuck, {}), ("a", {})]) == [TIMED_OUT, OK]
        assert runner.score_all([("b", {}), ("c", {})]) == [OK, OK]  # a fresh worker
        counters = runner.counters
    assert (counters.timeouts, counters.kills, counters.replacements) == (1, 1, 1)


def test_a_timed_out_worker_is_replaced_within_the_batch(tmp_path):
    """Two workers: one hangs; the other naps, then holds the first "meet" at a barrier for
    two. Only a worker started in the hung one's place (at 1.5 s) can run the second "meet"
    before the first one's own limit (at 0.75 + 1.5 s) and let both pass."""
    meet = _meeting(tmp_path, 2)
    with RewardRunner(scripted, workers=2, timeout_s=1.5) as runner:
        out = runner.score_all([("hang", {}), ("nap", {}), ("meet", meet), ("meet", meet)])
    assert out == [TIMED_OUT, OK, OK, OK]


def test_a_worker_that_dies_mid_call_scores_zero_and_is_replaced(caplog):
    with RewardRunner(scripted, workers=2, timeout_s=30) as runner:
        with caplog.at_level(logging.WARNING, logger="grpo.reward"):
            out = runner.score_all([("crash", {}), ("a", {}), ("b", {})])
        assert out == [(0.0, {"reward_error": "the reward worker died (exit code 7)"}), OK, OK]
        assert runner.score_all([("c", {})] * 3) == [OK] * 3
        assert runner.counters == RunnerCounters(calls=6, deaths=1, replacements=1)
    assert "the reward worker died (exit code 7); scored 0, worker replaced" in caplog.text


def test_the_timeout_counts_from_the_start_of_each_call():
    """Three 0.75 s calls on one worker take 2.25 s, past the 1.5 s limit, yet none times out."""
    with RewardRunner(scripted, workers=1, timeout_s=1.5) as runner:
        t0 = time.monotonic()
        assert runner.score_all([("nap", {})] * 3) == [OK] * 3
        assert time.monotonic() - t0 >= 2.25 and runner.counters.timeouts == 0


def test_errors_score_zero_with_reward_error_as_score_reports_them():
    with RewardRunner(scripted, workers=3, timeout_s=30) as runner:
        out = runner.score_all([("a", {}), ("boom", {}), ("nan", {})])
    assert out[0] == OK
    assert out[1] == (0.0, {"reward_error": "RuntimeError: boom"})
    assert out[2][0] == 0.0 and out[2][1]["reward_error"].startswith("ValueError: ")


def test_what_score_lets_through_is_raised_naming_the_function():
    with RewardRunner(scripted, workers=2, timeout_s=30) as runner:
        with pytest.raises(RewardWorkerError, match=r"rewards_for_tests:scripted raised SystemEx"):
            runner.score_all([("exit", {}), ("hang", {})])
        assert runner.score_all([("a", {})]) == [OK]  # the runner goes on with new workers


def test_close_stops_every_worker_at_once():
    runner = RewardRunner(scripted, workers=3, timeout_s=0.2)
    assert runner.score_all([("hang", {}), ("a", {})]) == [TIMED_OUT, OK]
    pids = runner.pids()
    t0 = time.monotonic()
    runner.close()
    assert time.monotonic() - t0 < CLOSE_WAIT_S + 1
    assert len(pids) == 3 and not any(running(pid) for pid in pids)
    runner.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        runner.score_all([("a", {})])


def test_too_many_timeouts_in_a_row_stop_with_an_error_naming_the_function():
    runner = RewardRunner(scripted, workers=2, timeout_s=0.2, max_hangs=1)
    with runner, pytest.raises(RewardHangError, match=r"scripted: 2 calls in a row timed out"):
        runner.score_all([("hang", {}), ("hang", {})])


def test_bad_arguments_are_refused():
    for kwargs in ({"workers": 0}, {"timeout_s": 0}, {"timeout_s": float("inf")}):
        with pytest.raises(ValueError):
            RewardRunner(digit_fraction, **kwargs)


def test_a_reward_a_worker_cannot_import_is_refused_in_one_line():
    def local(completion: str, row: dict) -> float:
        return 1.0

    for fn in (local, lambda c, r: 1.0):
        with pytest.raises(ValueError, match="cannot be sent to a reward worker process") as e:
            RewardRunner(fn)
        assert "\n" not in str(e.value) and "top level of an importable module" in str(e.value)


def test_a_reward_module_missing_in_the_worker_is_named(tmp_path, monkeypatch):
    (tmp_path / "vanishing_reward.py").write_text("def reward(c, r):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from vanishing_reward import reward  # type: ignore[import-not-found]

    runner = RewardRunner(reward, workers=1)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with runner, pytest.raises(RewardWorkerError) as e:
        runner.score_all([("a", {})])
    assert str(e.value).startswith(
        "reward function vanishing_reward:reward cannot be loaded in a worker process: "
        "ModuleNotFoundError: No module named 'vanishing_reward'"
    )


def test_a_process_whose_reward_spins_forever_still_exits():
    """A pure-Python infinite loop times out, and the process exits at once."""
    script = textwrap.dedent(
        """
        from grpo.tasks import RewardRunner
        from tests.rewards_for_tests import scripted

        with RewardRunner(scripted, workers=2, timeout_s=0.3) as runner:
            print(runner.score_all([("spin", {}), ("boom", {})]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([TIMED_OUT, (0.0, {"reward_error": "RuntimeError: boom"})])


_OWNER = """
import sys
from grpo.tasks import RewardRunner
from tests.rewards_for_tests import scripted

runner = RewardRunner(scripted, workers=2, timeout_s=3600)
print(runner.score_all([("a", {})]), flush=True)
runner.score_all([("pid", {"pid_file": sys.argv[1]}), ("regex", {})])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_owner_leaves_no_worker_behind(tmp_path):
    """Workers stuck in calls (one asleep, one in a regex holding its GIL) die with the
    process that started them when it is SIGKILLed: no orphans (docs/reliability.md)."""
    pid_file = tmp_path / "pid"
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(pid_file)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    owner.stdout.readline()  # the workers are up
    children = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(owner.pid)]).split()]
    try:
        assert wait_until(pid_file.exists, 60) and len(children) == 2
        owner.kill()
        owner.wait()
        assert wait_until(lambda: not any(running(pid) for pid in children), 10), children
    finally:
        owner.kill()
        for pid in children:
            kill_if_running(pid)


def test_first_call_hangs_hangs_once_per_sampler():
    """The multi-sampler test's reward: only the first call of the process that owns the
    workers hangs, though several workers run it and the killed one is replaced."""
    from tests.rewards_for_tests import first_call_hangs

    with RewardRunner(first_call_hangs, workers=2, timeout_s=1.0) as runner:
        first = runner.score_all([("a", {})] * 3)
        assert first.count(TIMED_OUT) == 1
        assert TIMED_OUT not in runner.score_all([("b", {})] * 4)


def test_counters_as_metrics():
    stats = RunnerCounters(calls=5, timeouts=1, kills=2, deaths=0, replacements=2).stats()
    assert stats == {
        "reward_worker_calls": 5.0,
        "reward_worker_timeouts": 1.0,
        "reward_worker_kills": 2.0,
        "reward_worker_deaths": 0.0,
        "reward_worker_replacements": 2.0,
    }
    assert pickle.loads(pickle.dumps(RunnerCounters())) == RunnerCounters()


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


def test_batch_maker_scores_through_the_runner_and_timeouts_reach_the_metrics():
    """A BatchMaker (log-probs on the trainer: no model) whose reward hangs on one answer: that
    answer scores 0 with reward_error 'timeout', the rest score, and the info crosses the wire
    into the trainer's reward_timeouts."""
    from grpo.sampler.episodes import BatchMaker
    from grpo.tasks.encoding import Prompt
    from grpo.trainer.outputs import batch_metrics
    from grpo.wire.codec import decode, encode_batch

    cfg = load_config(None, ["train.logprobs_on=trainer", "rollout.questions_per_step=2",
                             "rollout.group_size=3", "reward.workers=3"])  # fmt: skip
    prompts = [Prompt(i, {"q": i}, np.array([5, 6], dtype=np.int32)) for i in (7, 9)]
    shard = SimpleNamespace(position=0)
    weights = SimpleNamespace(version=0, reload_s=0.0, stats=dict)
    gens = _Engine().generate([p.ids for p in prompts], SimpleNamespace(n=3))

    with RewardRunner(hangs_on_five, cfg.reward.workers, timeout_s=0.5) as runner:
        maker = BatchMaker(cfg, _Tokenizer(), runner, shard, weights, SimpleNamespace())
        groups = maker.score_groups(prompts, gens)
        batch = maker.batch(0, groups, 0, {"gen_s": 1.0, "gen_tokens": 12.0})
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
    assert metrics["flat_groups_frac"] == 0.0  # both groups' rewards differ


def test_the_closing_summary_counts_the_reward_s_failures():
    """Issue 64, item 3: the summary says how many answers the reward failed on, and how many
    of those timed out, over the whole run."""
    from grpo.trainer.outputs import reward_failures

    rows = [{"completion_lens": [3] * 16, "reward_errors": 5, "reward_timeouts": 2},
            {"completion_lens": [3] * 16, "reward_errors": 1, "reward_timeouts": 0}]  # fmt: skip
    assert reward_failures(rows) == "6 errors (2 of them timeouts) in 32 answers"
    assert reward_failures([]) == "0 errors (0 of them timeouts) in 0 answers"


@pytest.mark.parametrize("adapter", [False, True], ids=["model", "lora"])
def test_the_closing_summary_names_what_the_run_made_with_absolute_paths(
    tmp_path, capsys, monkeypatch, adapter
):
    """Issue 64, item 6: the summary's paths work from the user's own directory, and a LoRA
    run's last version is called an adapter, with the merge-lora line that makes a model."""
    import json
    from pathlib import Path

    from grpo.trainer.outputs import summarise_run

    run = tmp_path / "runs" / "r"
    (run / "versions" / "v000002").mkdir(parents=True)
    row = {"step": 1, "sampler_id": "sampler-0", "reward_mean": 0.5, "completion_lens": [3, 4],
           "reward_errors": 1, "reward_timeouts": 0, "staleness": 0, "time": 1.0}  # fmt: skip
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    if adapter:  # what peft's save_pretrained writes for an adapter
        (run / "versions" / "v000002" / "adapter_config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    summarise_run(Path("runs", "r"), 2, 2)
    out = capsys.readouterr().out
    assert f"  metrics:     {run}/metrics.jsonl\n" in out
    grpo = f"{sys.executable} -m grpo"  # this venv's: a bare python is rarely the project's
    assert f"  answers:     {grpo} samples {run}\n" in out
    lora = (f"  final adapter: {run}/final (-> versions/v000002); a model of it: {grpo} merge-lora "
            f"{run}/final {run}/merged\n")  # fmt: skip
    assert (lora if adapter else f"  final model: {run}/final ") in out
    assert ("final model" in out) != adapter


def test_flat_groups_are_reported_whatever_the_sampler_did_with_them():
    """Issue 64, item 7: sampler_flat_groups_* read 0 without dynamic sampling although half the
    demo's groups were flat at step 1; flat_groups_frac counts them in every batch."""
    import numpy as np

    from grpo.trainer.outputs import flat_group_share

    rewards = np.array([0.0, 0.0, 0.0, 1.0, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0])
    assert flat_group_share(rewards, 4) == pytest.approx(2 / 3)
    assert flat_group_share(rewards, 2) == pytest.approx(5 / 6)
    assert flat_group_share(np.arange(4.0), 4) == 0.0
