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
from functools import partial
from types import MappingProxyType
from typing import Any

from torch import Tensor

from grpo.algos import KlControl, overlong_penalty
from grpo.algos.registry import Estimator, get_estimator, get_policy_loss
from grpo.config import Config, ConfigError, load_config
from grpo.config.data import parse_variants
from grpo.config.passes import scored_by
from grpo.config.peer_names import peer_algorithm
from grpo.core.paths import REPO_ROOT
from grpo.preflight import preflight
from grpo.rollout.registry import check_engine_name
from grpo.scoring.kernels import Truncation
from grpo.tasks import get_task, phrasing
from grpo.tasks.mixture import mixture_task
from grpo.tools import Toolbox

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
        self,
        old_logp: Tensor,
        logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """`is_weights`: the rollout correction's, passed only when there are some."""
        extra = {} if is_weights is None else {"is_weights": is_weights}
        return self.fn(old_logp, logp, advantages, mask, **self.options, **extra)


@dataclass(frozen=True)
class Overlong:
    """DAPO's overlong penalty (algo.overlong_buffer > 0): answers in the last `buffer` tokens
    before max_new_tokens lose up to `factor` of reward."""

    max_new_tokens: int
    buffer: int
    factor: float

    def __call__(self, rewards: Tensor, lengths: Tensor) -> Tensor:
        return rewards + overlong_penalty(lengths, self.max_new_tokens, self.buffer, self.factor)


@dataclass(frozen=True)
class Correction:
    """The rollout correction (algo.rollout_correction) with its threshold and bands."""

    spec: str
    threshold: float
    bands: Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class Advantage:
    """The advantage estimator (algo.advantage) with the constants it declared: called with
    the rewards, the mask (or group size) and the inputs only a step has."""

    estimator: Estimator
    constants: Mapping[str, Any]  # of gamma, lam, reward_weight: those it declared

    def __call__(self, rewards: Tensor, shape: Tensor | int, **inputs: Any) -> Tensor:
        return self.estimator.fn(rewards, shape, **self.constants, **inputs)


@dataclass(frozen=True)
class ExperiencePlan:
    """What the experience stage (grpo.trainer.experience) does to every batch: the reward
    shaping, in order; the KL of the sampling policy to the reference (measured, and paid in
    the reward when `kl_in_reward`); which answers get no loss; the rollout correction; and
    the advantage estimator with the constants it declared (given the critic's values when
    it needs them, GAE)."""

    shaping: tuple[Overlong, ...]
    kl_reward_kind: str  # the estimator of the KL measured here (not the loss's kl_kind)
    kl_in_reward: bool
    mask_truncated: bool
    correction: Correction | None
    advantage: Advantage


@dataclass(frozen=True)
class Objective:
    """One micro-batch's loss (grpo.trainer.step.micro_batch_loss): the policy loss with its
    options settled, plus `kl_coef` times the KL to the reference (by `kl_kind`), minus
    `entropy_coef` times the entropy; and how the forward reads the answers."""

    policy: LossPlan
    kl_kind: str
    kl_coef: float
    entropy_coef: float
    temperature: float  # the sampling temperature the log-probs are taken at
    packed: bool
    max_new_tokens: int  # Dr. GRPO's constant: the longest possible answer


@dataclass(frozen=True)
class UpdatePlan:
    """The update (grpo.trainer.step.update): `ppo_epochs` passes over a rank's rows, one
    optimizer step per mini-batch of `mini_batch_seqs`, micro-batches of up to
    `micro_batch_tokens`; with a critic, the steps it warms up alone."""

    objective: Objective
    ppo_epochs: int
    mini_batch_seqs: int  # sequences per rank per optimizer step
    micro_batch_tokens: int  # train.max_tokens_per_micro_batch (0: by count alone)
    critic_warmup_steps: int


@dataclass(frozen=True)
class ScoringPlan:
    """The trainer's old and reference log-probs (train.logprobs_on: trainer), as the sampler
    takes them: at its temperature, on its truncated vocabulary."""

    truncation: Truncation
    temperature: float
    packed: bool
    batch_size: int


@dataclass(frozen=True)
class RunPlan:
    experience: ExperiencePlan
    update: UpdatePlan
    scoring: ScoringPlan
    scored_by_sampler: frozenset[str]  # the log-prob arrays each role computes (config.passes)
    scored_by_trainer: frozenset[str]
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
        if cfg.data.instructions or cfg.eval.prompt_variants:  # a task's words, not a mixture's
            key = "data.instructions" if cfg.data.instructions else "eval.prompt_variants"
            raise ConfigError(f"{key} is not offered with data.mixture (several tasks' words)")
    else:
        _check_phrasings(cfg)
    if cfg.rollout.tools:
        _looked_up("rollout.tools", Toolbox.named, cfg.rollout.tools)
    _check_trackers(cfg)
    advantage = plan_advantage(cfg)
    return RunPlan(
        experience=plan_experience(cfg, advantage),
        update=plan_update(cfg, cfg.world if world is None else world, loss),
        scoring=plan_scoring(cfg),
        scored_by_sampler=scored_by(cfg, "sampler"),
        scored_by_trainer=scored_by(cfg, "trainer"),
        kl_control=plan_kl_control(cfg),
    )


def plan_objective(cfg: Config, loss: LossPlan | None = None) -> Objective:
    algo = cfg.algo
    return Objective(
        policy=loss or plan_loss(cfg),
        kl_kind=algo.kl_kind,
        kl_coef=algo.kl_loss_coef,
        entropy_coef=algo.entropy_coef,
        temperature=cfg.rollout.temperature,
        packed=cfg.packed,
        max_new_tokens=cfg.rollout.max_new_tokens,
    )


def plan_update(cfg: Config, world: int, loss: LossPlan | None = None) -> UpdatePlan:
    """The update of `cfg` on `world` trainer ranks."""
    return UpdatePlan(
        objective=plan_objective(cfg, loss),
        ppo_epochs=cfg.train.ppo_epochs,
        mini_batch_seqs=cfg.mini_batch_seqs(world),
        micro_batch_tokens=cfg.train.max_tokens_per_micro_batch,
        critic_warmup_steps=cfg.critic.warmup_steps,
    )


def plan_scoring(cfg: Config) -> ScoringPlan:
    r = cfg.rollout
    return ScoringPlan(
        Truncation(r.top_p, r.top_k), r.temperature, cfg.packed, cfg.train.micro_batch_size
    )


def plan_experience(cfg: Config, advantage: Advantage | None = None) -> ExperiencePlan:
    """algo.*'s experience stage, the estimator looked up (ConfigError naming the key)."""
    algo = cfg.algo
    correction = None
    if algo.rollout_correction != "none":
        bands = MappingProxyType(algo.correction_bands())
        correction = Correction(algo.rollout_correction, algo.rollout_correction_threshold, bands)
    return ExperiencePlan(
        shaping=(Overlong(cfg.rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_factor),)
        if algo.overlong_buffer
        else (),
        kl_reward_kind=algo.kl_reward_kind,
        kl_in_reward=algo.kl_in_reward,
        mask_truncated=algo.mask_truncated,
        correction=correction,
        advantage=advantage or plan_advantage(cfg),
    )


def plan_advantage(cfg: Config) -> Advantage:
    """algo.advantage looked up (ConfigError naming the key), with the constants it declared."""
    algo = cfg.algo
    estimator = _looked_up("algo.advantage", get_estimator, algo.advantage)
    declared = {"gamma": {"gamma": algo.gamma}, "lam": {"lam": algo.lam},
                "teacher": {"reward_weight": algo.opd_reward_weight}}  # fmt: skip
    constants: dict[str, Any] = {}
    for need in estimator.needs:
        constants |= declared.get(need, {})
    return Advantage(estimator, MappingProxyType(constants))


def plan_kl_control(cfg: Config) -> KlControl:
    algo = cfg.algo
    adaptive = algo.kl_in_reward and algo.kl_ctrl == "adaptive"
    return KlControl(adaptive, algo.kl_target, algo.kl_horizon)


def check_names(cfg: Config) -> None:
    """Every name in `cfg` that picks an implementation resolves, and the loss takes the options
    the config sets; else ConfigError naming the key and the valid names."""
    plan_run(cfg)


def _check_phrasings(cfg: Config) -> None:
    """data.instructions and eval.prompt_variants can be asked of the task, and no variant is a
    phrasing training uses (ConfigError naming the key)."""
    task = get_task(cfg.data.task)
    _looked_up("data.instructions", partial(phrasing.varied, task), cfg.data.instructions)
    variants = parse_variants(cfg.eval.prompt_variants)
    asked = list(cfg.data.instructions) or [task.instruction]
    for variant in variants:
        _looked_up("eval.prompt_variants", partial(phrasing.rephrased, task), variant)
    unseen = partial(phrasing.unseen, variants, asked)
    _looked_up("eval.prompt_variants", unseen, cfg.data.system_prompt)


def _looked_up(key: str, lookup: Callable[[Any], Any], value: Any) -> Any:
    try:
        return lookup(value)
    except ValueError as e:
        said = peer_algorithm(key, value) if isinstance(value, str) else None
        raise ConfigError(f"{key}: {said or e}") from None


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
        "is_weights": None if algo.rollout_correction == "none" else algo.rollout_correction,
    }
    for option, value in given.items():
        if value is not None and option not in params:
            key = "algo.rollout_correction" if option == "is_weights" else f"algo.{option}"
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


CHECK_USAGE = """usage: python -m grpo check CONFIG [key=value ...]
  check the config, look up every name in it (task, reward, loss, estimator, ...) and open
  what a run of both roles here will open (model and tokenizer files, data rows, the run dir);
  "config ok" and exit 0, or one line naming the cause and exit 2"""


def main(argv: list[str]) -> int:
    """`python -m grpo check CONFIG [overrides]`: load the config and look up every name in
    it; one line naming the cause and exit 2 when something is wrong."""
    if not argv or argv[0] in ("-h", "--help"):
        print(CHECK_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        cfg = load_config(argv[0], argv[1:])
        check_names(cfg)
        # launch.sh runs the roles from the repository, where a relative output_dir is: from the
        # user's own dir the check would open (and pass or fail on) a run dir the run never uses.
        cfg.output_dir = str(REPO_ROOT / cfg.output_dir)
        preflight(cfg)  # what a run of both roles on this machine will open
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print("config ok")
    return 0
