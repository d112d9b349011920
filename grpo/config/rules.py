"""The rules that read several sections of the config at once: checks across sections, and
what a config resolves to where more than one section decides it. Above every section's module
(which validates its own values and imports none of this), below the checks that run them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpo.config.engines import BUILT_IN, abilities
from grpo.config.errors import ConfigError
from grpo.config.teacher import OPD, SERVICE
from grpo.core.vocabulary import parse_correction

if TYPE_CHECKING:
    from grpo.config.sections import Config


def check_continuous(cfg: Config) -> None:
    """rollout.mode: continuous's limits (ConfigError, one line)."""
    r = cfg.rollout
    if r.mode != "continuous":
        return
    if not abilities(r.backend).continuous:
        able = [name for name, a in BUILT_IN.items() if a.continuous]
        raise ConfigError(f"rollout.mode=continuous runs the {' or '.join(able)} engine, "
                          f"not {r.backend!r}")  # fmt: skip
    if r.max_turns > 1 or r.dynamic_sampling:
        raise ConfigError(
            "rollout.mode=continuous takes single-turn answers without dynamic_sampling: "
            "set rollout.max_turns=1 and rollout.dynamic_sampling=false"
        )
    if r.slots < 0 or r.slots % r.group_size:
        raise ConfigError(
            f"rollout.slots={r.slots} must be a multiple of group_size={r.group_size}"
        )
    # With a lag, an answer's tokens come from several versions, none of them the old policy
    # the loss's ratio is taken against: each token needs its own behaviour weight.
    weight_mode, _ = parse_correction(cfg.algo.rollout_correction)
    if cfg.train.max_staleness and weight_mode == "none":
        raise ConfigError(
            f"rollout.mode=continuous with train.max_staleness={cfg.train.max_staleness} "
            "samples an answer with several versions: set algo.rollout_correction=decoupled "
            "(or another weight mode) so each token is weighted by its own behaviour log-prob"
        )


def serves_teacher(cfg: Config) -> bool:
    """Whether the reward service (ROLE=reward) loads the teacher and serves its log-probs."""
    return bool(cfg.teacher.path) and cfg.teacher.where == SERVICE


def service_scores(cfg: Config) -> bool:
    """Whether the samplers ask the reward service for scores: whenever reward.service_addr is
    set, except for a service that serves the teacher alone (no reward_server.backend)."""
    return bool(cfg.reward.service_addr) and (
        bool(cfg.reward_server.backend) or not serves_teacher(cfg)
    )


def check_teacher(cfg: Config) -> None:
    """ConfigError, one line, when algo.advantage=opd has no teacher or its weight is bad, or
    a served teacher has no service to run in."""
    algo, t = cfg.algo, cfg.teacher
    if algo.opd_reward_weight < 0:
        raise ConfigError(f"algo.opd_reward_weight must be >= 0, got {algo.opd_reward_weight!r}")
    if algo.advantage == OPD and not t.path:
        raise ConfigError(
            "algo.advantage=opd needs a teacher: set teacher.path (an HF model dir or "
            "'embedded') whose per-token log-probs the student's answers are scored by"
        )
    if t.max_tokens < 2:
        raise ConfigError(f"teacher.max_tokens must be >= 2, got {t.max_tokens!r}")
    if t.where == SERVICE and t.path and not cfg.reward.service_addr:
        raise ConfigError(
            "teacher.where=service needs reward.service_addr: the reward service (ROLE=reward) "
            "that loads teacher.path and that the samplers ask, e.g. tcp://teacher-node:5560"
        )
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if serves_teacher(cfg) and t.max_tokens < longest:
        raise ConfigError(
            f"teacher.max_tokens={t.max_tokens} is below data.max_prompt_tokens + "
            f"rollout.max_new_tokens ({longest}): the service would refuse the longest answers"
        )
