"""Mixtures (``data.mixture``): several datasets in one run, each with its own task and reward.

Every row of an entry carries the entry's name under `SOURCE_KEY`; the mixture's task builds
a row's prompt with that entry's task and scores it with that entry's reward, and the reward
info of every answer names the entry as ``data_source``, which the trainer's metrics and the
evaluation group by (grpo.observe.metrics.source_rates). Which entry each question is drawn
from is grpo.sampler.data's (a seeded, weighted pick per position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpo.config import ConfigError
from grpo.config.data import parse_mixture

from .base import RewardFn, Row, Task, get_task, mapped, run_reward, score

if TYPE_CHECKING:
    from grpo.config import Config

# The row key naming the entry a row came from (a name no dataset is likely to have).
SOURCE_KEY = "mixture_source"
# The reward info key the metrics group by: verl's word for a row's dataset.
INFO_KEY = "data_source"


@dataclass(frozen=True)
class Source:
    """One entry of the mixture: its task (with rows.columns), reward, rows and weight."""

    name: str
    task: Task
    reward: RewardFn
    train: str
    test: str  # '' = none
    weight: float


def sources(cfg: Config) -> tuple[Source, ...]:
    """The entries of data.mixture, their tasks and rewards looked up; ConfigError in one line
    naming the entry whose task or reward is not one (grpo.plan checks data.task alone)."""
    out = []
    for i, e in enumerate(parse_mixture(cfg.data.mixture, cfg.data.task)):
        try:
            task = mapped(get_task(e.task), cfg.rows.columns)
        except ValueError as err:
            raise ConfigError(f"data.mixture: entry {i}: task: {err}") from None
        try:
            reward = run_reward(task, e.reward)
        except ValueError as err:
            raise ConfigError(f"data.mixture: entry {i}: reward: {err}") from None
        out.append(Source(e.name, task, reward, e.train, e.test or task.default_test, e.weight))
    return tuple(out)


def tagged(rows: list[Row], name: str) -> list[Row]:
    """`rows`, each a copy naming its entry."""
    return [{**row, SOURCE_KEY: name} for row in rows]


def train_rows(source: Source) -> list[Row]:
    return tagged(source.task.load(source.train), source.name)


def test_rows(cfg: Config, count: int) -> list[Row]:
    """The first `count` test rows of every entry that has test rows, entry after entry."""
    found = [tagged(s.task.load(s.test)[:count], s.name) for s in sources(cfg) if s.test]
    if not found:
        raise ValueError(
            "no entry of data.mixture has test rows: set test in one, or eval.interval=0"
        )
    return [row for rows in found for row in rows]


@dataclass(frozen=True)
class MixtureReward:
    """The reward of the row's entry, its info naming the entry (a failed call too: it scores
    0 with a reward_error, and still counts for its entry). A class, not a closure: the reward
    workers receive it pickled."""

    rewards: tuple[tuple[str, RewardFn], ...]

    def __call__(self, completion: str, row: Row) -> tuple[float, dict]:
        name = row[SOURCE_KEY]
        value, info = score(dict(self.rewards)[name], completion, row)
        return value, {**info, INFO_KEY: name}


@dataclass(frozen=True)
class MixtureMessages:
    """The chat of a row as its entry's task builds it."""

    tasks: tuple[tuple[str, Task], ...]

    def __call__(self, row: Row, system_prompt: str) -> list[dict[str, str]]:
        return dict(self.tasks)[row[SOURCE_KEY]].build_messages(row, system_prompt)


def _load(source: str) -> list[Row]:
    raise ValueError(f"a mixture loads its rows per entry (data.mixture), not from {source!r}")


def mixture_task(cfg: Config) -> Task:
    """The task of a run with data.mixture: each row's prompt and reward those of its entry."""
    found = sources(cfg)
    return Task(
        name="mixture",
        load=_load,
        build_messages=MixtureMessages(tuple((s.name, s.task) for s in found)),
        reward=MixtureReward(tuple((s.name, s.reward) for s in found)),
        default_train="",
        default_test="",
    )


def task_for(cfg: Config) -> Task:
    """The run's task: ``data.task`` with ``rows.columns`` applied to what it loads; with
    ``data.mixture``, the mixture's."""
    if cfg.data.mixture:
        return mixture_task(cfg)
    return mapped(get_task(cfg.data.task), cfg.rows.columns)
