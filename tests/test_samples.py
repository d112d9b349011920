"""What samples.jsonl holds (grpo.observe.samples): each step's answers chosen by reward, the
best first and the worst last, each with its own prompt and answer as text and the version that
sampled it; each evaluation's greedy answers under their own questions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from grpo.core.episode import EpisodeBatch
from grpo.eval.questions import QuestionResult
from grpo.observe.samples import EVAL, by_reward, eval_rows, sample_rows
from tests.test_episode import make_batch


def decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def test_answers_are_chosen_best_first_worst_last_and_the_rest_between() -> None:
    rewards = np.array([0.5, 2.0, -1.0, 1.0, 0.0])
    assert by_reward(rewards, 3) == [1, 0, 2]
    assert by_reward(rewards, 9) == [1, 3, 0, 4, 2]
    assert by_reward(rewards, 0) == []


def test_a_step_s_rows_hold_each_answer_with_its_own_prompt_and_version() -> None:
    made = make_batch(seed=3, num_groups=2, group_size=4, rollout=False)
    batch = EpisodeBatch.from_columns(made.columns, 4, 3, 0, "sampler-1", {})
    rows = sample_rows(batch, 5, decode, 8)
    assert len(rows) == 8
    for row in rows:
        (episode,) = [e for e in batch.episodes
                      if decode(e.completion_ids.tolist()) == row["answer"]
                      and float(e.reward) == row["reward"]]  # fmt: skip
        assert row["prompt"] == decode(episode.prompt_ids.tolist()) != row["answer"]
        assert (row["step"], row["version"], row["sampler_id"]) == (5, 3, "sampler-1")


def test_each_evaluation_answer_is_under_its_own_question() -> None:
    """Two questions of four, neither the first: each row holds its question's prompt and
    index (a fixture of one question would hide which prompt a row took)."""
    prompts = [SimpleNamespace(ids=[10 * i, 10 * i + 1]) for i in range(4)]
    results = [QuestionResult(index=i, greedy_correct=i == 2, greedy_formatted=True,
                              answer=f"answer {i}", reward=float(i), finish_reason="stop")
               for i in (2, 3)]  # fmt: skip
    rows = eval_rows(results, 8, prompts, decode)
    assert [(r["group_id"], r["prompt"], r["answer"]) for r in rows] == [
        (2, "20 21", "answer 2"), (3, "30 31", "answer 3")]  # fmt: skip
    assert all(r["step"] == r["version"] == 8 and r["sampler_id"] == EVAL for r in rows)
    assert [r["reward_info"] for r in rows] == [
        {"correct": True, "formatted": True}, {"correct": False, "formatted": True}]  # fmt: skip
