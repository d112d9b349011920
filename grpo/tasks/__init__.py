"""Tasks: datasets, prompts and rewards, looked up by name (``get_task("gsm8k")``, ``"math"``)."""

# Importing a task module registers it with the registry in .base.
from . import arithmetic, gsm8k, math500, prompts
from .base import (
    REPO_ROOT,
    RewardFn,
    Row,
    Task,
    get_task,
    load_reward_fn,
    load_rows,
    register_task,
    resolve_path,
    run_reward,
    score,
    task_names,
)
from .mixture import task_for
from .runner import RewardHangError, RewardRunner, RewardWorkerError, RunnerCounters

__all__ = [
    "REPO_ROOT",
    "arithmetic",
    "RewardFn",
    "RewardHangError",
    "RewardRunner",
    "RewardWorkerError",
    "Row",
    "RunnerCounters",
    "Task",
    "get_task",
    "gsm8k",
    "load_reward_fn",
    "load_rows",
    "math500",
    "prompts",
    "register_task",
    "resolve_path",
    "run_reward",
    "score",
    "task_for",
    "task_names",
]
