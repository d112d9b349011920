"""What a run will open, checked before any model loads (launch.sh's up-front check, `python -m
grpo check`, and each worker's start): the model dir, the train dataset and the reward (imported,
its signature checked), the DeepSpeed config and, with `--resume`, the saved state. Each missing
one is a ConfigError naming the key, rather than a traceback after a minute of loading models.
`role` picks what that role opens: a sampler's node need not hold the DeepSpeed config, a
trainer's need not hold the dataset or the reward's module."""

from __future__ import annotations

from grpo.config import Config, ConfigError
from grpo.core.durable import TRAIN_STATE_MARKER, train_state_dir
from grpo.models.embedded import EMBEDDED, ModelError, require_model_dir
from grpo.tasks import get_task, run_reward
from grpo.tasks.base import locate, resolve_path


def preflight(cfg: Config, role: str = "both") -> None:
    """ConfigError for the first file or directory `role` will open that is not there."""
    trainer, sampler = role in ("both", "trainer"), role in ("both", "sampler")
    if trainer or sampler:
        _model_dir(cfg.model.path)
    if sampler and not cfg.data.mixture:  # a mixture's entries are loaded by its own check
        task = get_task(cfg.data.task)
        _dataset("data.train", cfg.data.train or task.default_train)
        try:
            run_reward(task, cfg.data.reward)
        except ValueError as e:
            raise ConfigError(f"data.reward: {e}") from None
    if trainer:
        if not resolve_path(ds := cfg.train.deepspeed_config).is_file():
            raise ConfigError(f"train.deepspeed_config: no such file {ds!r}")
        state = train_state_dir(cfg.run_dir)
        if cfg.train.resume == "always" and not (state / TRAIN_STATE_MARKER).is_file():
            raise ConfigError(
                f"train.resume=always (--resume): no complete training state in {state}; "
                "drop --resume (or set train.resume=auto) to start the run"
            )


def _model_dir(path: str) -> None:
    if path != EMBEDDED:
        try:
            require_model_dir(path)
        except ModelError as e:
            raise ConfigError(f"model.path: {e}") from None


def _dataset(key: str, source: str) -> None:
    """A local file or directory that is not there (a hub name is left to the loader)."""
    try:
        locate(source)
    except FileNotFoundError:
        raise ConfigError(f"{key}: no such dataset file or directory {source!r}") from None
