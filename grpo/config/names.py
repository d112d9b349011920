"""Config values that name an implementation, checked against the registries (and a user's
`package.module:name` imported) before a run starts: one line naming the key and the valid
names, instead of an error deep inside the first step.

Kept apart from the other checks because it imports the registries (torch and all): reading a
key (`python -m grpo.config CONFIG --get KEY`) should not pay for that.
"""

from __future__ import annotations

from grpo.config.checks import ConfigError
from grpo.config.sections import Config
from grpo.core.vocabulary import GAE


def check_names(cfg: Config) -> None:
    from grpo.algos.registry import advantage_kind, get_policy_loss
    from grpo.rollout.registry import check_engine_name
    from grpo.tasks import get_task

    for key, value, lookup in (
        ("algo.loss", cfg.algo.loss, get_policy_loss),
        ("rollout.backend", cfg.rollout.backend, check_engine_name),
        ("data.task", cfg.data.task, get_task),
    ):
        try:
            lookup(value)
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
    _check_tools(cfg.rollout.tools)
    _check_loss_options(cfg, get_policy_loss(cfg.algo.loss))
    _check_trackers(cfg)
    if cfg.algo.advantage != GAE:
        try:
            advantage_kind(cfg.algo.advantage)
        except ValueError as e:
            raise ConfigError(f"algo.advantage: {e} (or {GAE!r})") from None


def _check_tools(names: list[str]) -> None:
    """Each tool in rollout.tools must be known, and their names and tags distinct."""
    from grpo.tools import Toolbox, get_tool

    if not names:
        return
    try:
        Toolbox([get_tool(name) for name in names])
    except ValueError as e:
        raise ConfigError(f"rollout.tools: {e}") from None


def _check_loss_options(cfg: Config, loss: object) -> None:
    """Options the config sets must be ones the loss takes (sapo has no clip range, cispo
    no dual clip): otherwise the first step would fail with a TypeError."""
    import inspect

    params = inspect.signature(loss).parameters  # type: ignore[arg-type]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    algo = cfg.algo
    given = {
        "agg": algo.agg,
        "clip_low": algo.clip_low,
        "clip_high": algo.clip_high,
        "clip_c": algo.clip_c,
        "weights": None if algo.rollout_correction == "none" else algo.rollout_correction,
    }
    for option, value in given.items():
        if value is not None and option not in params:
            key = "algo.rollout_correction" if option == "weights" else f"algo.{option}"
            raise ConfigError(
                f"{key}: the policy loss {algo.loss!r} takes no {option!r}; "
                f"leave it null (or none) for this loss"
            )


def _check_trackers(cfg: Config) -> None:
    """A tracker asked for must be installed: a missing one would end the run at its start."""
    import importlib.util

    wanted = {"tensorboard": cfg.logging.tensorboard, "wandb": cfg.logging.wandb != "off"}
    for package, on in wanted.items():
        if on and importlib.util.find_spec(package) is None:
            off = "false" if package == "tensorboard" else "off"
            raise ConfigError(
                f"logging.{package}: the {package} package is not installed; "
                f"pip install {package}, or set logging.{package}: {off}"
            )
