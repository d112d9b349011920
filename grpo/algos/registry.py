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
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; valid: {sorted(table)}") from None


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator: register a policy loss under `name` (ValueError if taken).

    A policy loss has the signature
    `fn(old_logp, logp, advantages, mask, *, agg, clip_low, clip_high, clip_c) -> (loss, metrics)`.
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
