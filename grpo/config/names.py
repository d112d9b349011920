"""Config values that name an implementation, checked against the registries (and a user's
`package.module:name` imported) before a run starts: one line naming the key and the valid
names, instead of an error deep inside the first step.

Kept apart from the other checks because it imports the registries (torch and all): launch.sh
reads single keys many times and should not pay for that each time.
"""

from __future__ import annotations

from grpo.config.checks import ConfigError
from grpo.config.sections import Config

# The advantage that is not an estimator function: GAE needs the critic's values.
GAE = "gae"


def check_names(cfg: Config) -> None:
    from grpo.algos.registry import advantage_kind, get_policy_loss
    from grpo.rollout.registry import get_engine
    from grpo.tasks import get_task

    for key, value, lookup in (
        ("algo.loss", cfg.algo.loss, get_policy_loss),
        ("rollout.backend", cfg.rollout.backend, get_engine),
        ("data.task", cfg.data.task, get_task),
    ):
        try:
            lookup(value)
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
    if cfg.algo.advantage != GAE:
        try:
            advantage_kind(cfg.algo.advantage)
        except ValueError as e:
            raise ConfigError(f"algo.advantage: {e} (or {GAE!r})") from None
