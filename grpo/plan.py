"""The run plan: what a config means for the code that runs it, worked out once before a run
starts. Every name that picks an implementation is looked up (a registered one, or a user's
`package.module:name` imported), the policy loss's options are resolved against its own
defaults, and each mistake is one line naming the key, before any process does work.

Kept out of grpo.config, which stays a leaf that reads and checks values without importing the
registries (torch and all): `python -m grpo.config CONFIG --get KEY` should not pay for them.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from torch import Tensor

from grpo.algos import KlControl
from grpo.algos.registry import get_estimator, get_policy_loss
from grpo.config import Config, ConfigError, load_config
from grpo.config.passes import scored_by
from grpo.core.vocabulary import GAE
from grpo.preflight import preflight
from grpo.rollout.registry import check_engine_name
from grpo.tasks import get_task
from grpo.tasks.mixture import mixture_task
from grpo.tools import Toolbox, get_tool

# The keyword options the config gives a policy loss (None = the loss's own default).
LOSS_OPTIONS = ("agg", "clip_low", "clip_high", "clip_c")

# How the KL and entropy terms, and the micro-batches' shares, are averaged when neither the
# config nor the loss names an aggregation.
FALLBACK_AGG = "token-mean"


@dataclass(frozen=True)
class LossPlan:
    """The policy loss with its options settled: called once per micro-batch, it does no
    lookup and no signature inspection."""

    name: str
    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    options: Mapping[str, Any]  # the options the config sets, passed to every call
    agg: str  # how the other terms are averaged: the loss's aggregation, else FALLBACK_AGG

    def __call__(
        self, old_logp: Tensor, logp: Tensor, advantages: Tensor, mask: Tensor,
        weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
        """`weights`: the rollout correction's, passed only when there are some."""
        extra = {} if weights is None else {"weights": weights}
        return self.fn(old_logp, logp, advantages, mask, **self.options, **extra)


@dataclass(frozen=True)
class RunPlan:
    loss: LossPlan
    scored_by_sampler: frozenset[str]  # the log-prob arrays each role computes (config.passes)
    scored_by_trainer: frozenset[str]
    mini_batch_seqs: int  # sequences per rank per optimizer step
    kl_control: KlControl  # how the in-reward KL coefficient moves between steps


def own_default(fn: Callable, option: str) -> Any:
    """A policy loss's own default for `option` (what `null` in the config means): its
    signature is the one place it is written. None when it takes no such option."""
    parameter = inspect.signature(fn).parameters.get(option)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default


def plan_loss(cfg: Config) -> LossPlan:
    algo = cfg.algo
    fn = _looked_up("algo.loss", get_policy_loss, algo.loss)
    _check_loss_options(cfg, fn)
    # Options left null are not passed, so the loss's own defaults apply, and a user's loss
    # need not take the ones it has no use for.
    options = {option: getattr(algo, option) for option in LOSS_OPTIONS}
    options = {k: v for k, v in options.items() if v is not None}
    agg = algo.agg or own_default(fn, "agg") or FALLBACK_AGG
    return LossPlan(algo.loss, fn, MappingProxyType(options), agg)


def plan_run(cfg: Config, world: int | None = None) -> RunPlan:
    """The plan of a run of `cfg` on `world` trainer ranks (the config's, by default);
    ConfigError naming the key when a name does not resolve. Each name is looked up once."""
    loss = plan_loss(cfg)
    _looked_up("rollout.backend", check_engine_name, cfg.rollout.backend)
    _looked_up("data.task", get_task, cfg.data.task)
    if cfg.data.mixture:  # each entry's task and reward, looked up (ConfigError naming it)
        mixture_task(cfg)
    if cfg.rollout.tools:
        _looked_up("rollout.tools", lambda names: Toolbox([get_tool(n) for n in names]),
                   cfg.rollout.tools)  # fmt: skip
    _check_trackers(cfg)
    if cfg.algo.advantage != GAE:
        try:
            get_estimator(cfg.algo.advantage)
        except ValueError as e:
            raise ConfigError(f"algo.advantage: {e} (or {GAE!r})") from None
    world = cfg.world if world is None else world
    return RunPlan(
        loss=loss,
        scored_by_sampler=scored_by(cfg, "sampler"),
        scored_by_trainer=scored_by(cfg, "trainer"),
        mini_batch_seqs=cfg.mini_batch_seqs(world),
        kl_control=plan_kl_control(cfg),
    )


def plan_kl_control(cfg: Config) -> KlControl:
    algo = cfg.algo
    adaptive = algo.kl_in_reward and algo.kl_ctrl == "adaptive"
    return KlControl(adaptive, algo.kl_target, algo.kl_horizon)


def check_names(cfg: Config) -> None:
    """Every name in `cfg` that picks an implementation resolves, and the loss takes the options
    the config sets; else ConfigError naming the key and the valid names."""
    plan_run(cfg)


def _looked_up(key: str, lookup: Callable[[Any], Any], value: Any) -> Any:
    try:
        return lookup(value)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None


def _check_loss_options(cfg: Config, loss: Callable) -> None:
    """Options the config sets must be ones the loss takes (sapo has no clip range, cispo
    no dual clip): otherwise the first step would fail with a TypeError."""
    params = inspect.signature(loss).parameters
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
    wanted = {"tensorboard": cfg.logging.tensorboard, "wandb": cfg.logging.wandb != "off"}
    for package, on in wanted.items():
        if on and importlib.util.find_spec(package) is None:
            off = "false" if package == "tensorboard" else "off"
            raise ConfigError(
                f"logging.{package}: the {package} package is not installed; "
                f"pip install {package}, or set logging.{package}: {off}"
            )


def main(argv: list[str]) -> int:
    """`python -m grpo check CONFIG [overrides]`: load the config and look up every name in
    it; one line naming the cause and exit 2 when something is wrong."""
    if not argv:
        print("usage: python -m grpo check CONFIG [key=value ...]", file=sys.stderr)
        return 2
    try:
        cfg = load_config(argv[0], argv[1:])
        check_names(cfg)
        preflight(cfg)  # what a run of both roles on this machine will open
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print("config ok")
    return 0
