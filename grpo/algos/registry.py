"""Name -> function registries for policy losses and advantage estimators.

One grpo.core.registry.Registry per kind: a decorator adds to it, a getter fails loudly, and
registering a name twice is an error.

Each table has one calling convention, so a caller can use any registered name without
knowing which it is: outcome estimators map per-sequence rewards (N,) to (N,), token
estimators map per-token rewards (B, T) to (B, T). What an estimator takes beyond that is
declared where it registers (`needs`, from ESTIMATOR_INPUTS): the trainer reads no signature.
An estimator that needs the critic's values (GAE) makes the run build a critic; it runs where
every estimator does (grpo.trainer.experience.with_advantages), on the whole batch's values.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from grpo.core.registry import Registry

POLICY_LOSSES: Registry[Callable] = Registry("policy loss", callable, "a function")
ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry("advantage estimator", callable, "a function")
TOKEN_ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry(
    "token advantage estimator", callable, "a function"
)


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under `name` (ValueError if taken).

    A policy loss has the signature
    `fn(old_logp, logp, advantages, mask, *, agg, clip_low, clip_high, clip_c, is_weights)
    -> (loss, metrics)`, taking only the options it uses, and its keyword defaults are the
    loss's own defaults: the one place they are written (the config's `null` means them;
    docs/configuration.md lists them, read from here). Hyper-parameters the config has no key
    for (SAPO's temperatures, Clip-Cov's bounds, ...) are further keywords with defaults.
    """
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


# What an estimator may be given beyond its rewards (grpo.trainer.experience builds each):
#   gamma        keyword `gamma`: the discount, algo.gamma
#   components   keyword `components`: (N, K) the parts of each answer's reward (GDPO)
#   teacher      keywords `teacher_logp`, `student_logp` (B, T), `group_size`, `reward_weight`
#                (on-policy distillation: the teacher's and the old policy's log-probs)
#   lam          keyword `lam`: GAE's lambda, algo.lam
#   values       keyword `values` (B, T): the critic's values before the update. The run builds
#                a critic; the estimator's advantages are whitened over the batch's tokens
#                after it.
ESTIMATOR_INPUTS = frozenset({"gamma", "components", "teacher", "lam", "values"})
_NEEDS: dict[Callable, tuple[str, ...]] = {}


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator as the trainer calls it."""

    fn: Callable
    token_level: bool  # (B, T) token rewards and mask -> (B, T); else (N,) totals -> (N,)
    needs: tuple[str, ...]  # of ESTIMATOR_INPUTS

    @property
    def needs_critic(self) -> bool:
        return "values" in self.needs


def _registering(registry: Registry, name: str, needs: Iterable[str]) -> Callable:
    needs = tuple(needs)
    unknown = set(needs) - ESTIMATOR_INPUTS
    if unknown:
        raise ValueError(
            f"estimator {name!r} needs {sorted(unknown)}: an estimator may "
            f"declare {sorted(ESTIMATOR_INPUTS)}"
        )
    register = registry.register(name)

    def decorate(fn: Callable) -> Callable:
        _NEEDS[fn] = needs
        return register(fn)

    return decorate


def register_advantage_estimator(name: str, needs: Iterable[str] = ()) -> Callable:
    """Decorator: register an advantage estimator under `name` (ValueError if taken).

    An estimator has the signature `fn(rewards: (N,), group_size: int, **kw) -> (N,)`, where
    `kw` are the inputs it `needs` (ESTIMATOR_INPUTS).
    """
    return _registering(ADVANTAGE_ESTIMATORS, name, needs)


def get_advantage_estimator(name: str) -> Callable:
    return ADVANTAGE_ESTIMATORS.get(name)


def register_token_advantage_estimator(name: str, needs: Iterable[str] = ("gamma",)) -> Callable:
    """Decorator: register a token-level advantage estimator under `name` (ValueError if taken).

    A token estimator has the signature
    `fn(token_rewards: (B, T), mask: (B, T), **kw) -> (B, T)`, where `kw` are the inputs it
    `needs` (ESTIMATOR_INPUTS; by default the discount).
    """
    return _registering(TOKEN_ADVANTAGE_ESTIMATORS, name, needs)


def get_token_advantage_estimator(name: str) -> Callable:
    return TOKEN_ADVANTAGE_ESTIMATORS.get(name)


def get_estimator(name: str) -> Estimator:
    """The estimator `name`: a registered one, or a user's `package.module:function`, an
    outcome estimator taking no further inputs unless its module registered it otherwise."""
    fn = ADVANTAGE_ESTIMATORS.merged(TOKEN_ADVANTAGE_ESTIMATORS).get(name)
    token_level = fn in [TOKEN_ADVANTAGE_ESTIMATORS.entry(n) for n in TOKEN_ADVANTAGE_ESTIMATORS]
    return Estimator(fn, token_level, _NEEDS.get(fn, ("gamma",) if token_level else ()))
