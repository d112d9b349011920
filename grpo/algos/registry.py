"""Name -> function registries for policy losses and advantage estimators.

Kept deliberately dumb: a dict per kind, a decorator to add to it, a getter that fails
loudly. Registering a name twice is an error so that two modules can never silently
shadow each other's implementation depending on import order.

Each table has one calling convention, so a caller can use any registered name without
knowing which it is: outcome estimators map per-sequence rewards (N,) to (N,), token
estimators map per-token rewards (B, T) to (B, T). Anything that needs more inputs (GAE needs
values and also returns value targets) is exported as a plain function instead.
"""

from collections.abc import Callable
from typing import TypeVar

from grpo.core.plugins import resolve

F = TypeVar("F", bound=Callable)

POLICY_LOSSES: dict[str, Callable] = {}
ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}
TOKEN_ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}


def _register(table: dict[str, Callable], kind: str, name: str) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered (to {table[name].__name__})")
        table[name] = fn
        return fn

    return decorator


def _get(table: dict[str, Callable], kind: str, name: str) -> Callable:
    """A registered name, or a user's own function as `package.module:function`."""
    fn = resolve(table, kind, name)
    if not callable(fn):
        raise ValueError(f"{kind} {name!r} is a {type(fn).__name__}, not a function")
    return fn


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name` (ValueError if taken).

    A policy loss has the signature
    `fn(old_logp, logp, advantages, mask, *, agg, clip_low, clip_high, clip_c, weights)
    -> (loss, metrics)`, taking only the options it uses, and its keyword defaults are the
    loss's own defaults: the one place they are written (the config's `null` means them;
    docs/configuration.md lists them, read from here). Hyper-parameters the config has no key
    for (SAPO's temperatures, Clip-Cov's bounds, ...) are further keywords with defaults.
    """
    return _register(POLICY_LOSSES, "policy loss", name)


def get_policy_loss(name: str) -> Callable:
    return _get(POLICY_LOSSES, "policy loss", name)


def register_advantage_estimator(name: str) -> Callable[[F], F]:
    """Decorator: register an advantage estimator under `name` (ValueError if taken).

    An estimator has the signature `fn(rewards: (N,), group_size: int, **kw) -> (N,)`.
    """
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def get_advantage_estimator(name: str) -> Callable:
    return _get(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def register_token_advantage_estimator(name: str) -> Callable[[F], F]:
    """Decorator: register a token-level advantage estimator under `name` (ValueError if taken).

    A token estimator has the signature
    `fn(token_rewards: (B, T), mask: (B, T), **kw) -> (B, T)`.
    """
    return _register(TOKEN_ADVANTAGE_ESTIMATORS, "token advantage estimator", name)


def get_token_advantage_estimator(name: str) -> Callable:
    return _get(TOKEN_ADVANTAGE_ESTIMATORS, "token advantage estimator", name)


def advantage_kind(name: str) -> tuple[str, Callable]:
    """("token" | "outcome", the estimator) for `name`: a registered estimator, or a user's
    `package.module:function`, an outcome estimator unless its module registered it as a token
    one."""
    if name in TOKEN_ADVANTAGE_ESTIMATORS:
        return "token", TOKEN_ADVANTAGE_ESTIMATORS[name]
    fn = _get(ADVANTAGE_ESTIMATORS | TOKEN_ADVANTAGE_ESTIMATORS, "advantage estimator", name)
    return ("token" if fn in TOKEN_ADVANTAGE_ESTIMATORS.values() else "outcome"), fn
