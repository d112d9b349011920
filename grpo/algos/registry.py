"""Name -> function registries for policy losses and advantage estimators.

One grpo.core.registry.Registry per kind: a decorator adds to it, a getter fails loudly, and
registering a name twice is an error.

Each table has one calling convention, so a caller can use any registered name without
knowing which it is: outcome estimators map per-sequence rewards (N,) to (N,), token
estimators map per-token rewards (B, T) to (B, T). Anything that needs more inputs (GAE needs
values and also returns value targets) is exported as a plain function instead.
"""

from collections.abc import Callable

from grpo.core.registry import Registry

POLICY_LOSSES: Registry[Callable] = Registry("policy loss", callable, "a function")
ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry("advantage estimator", callable, "a function")
TOKEN_ADVANTAGE_ESTIMATORS: Registry[Callable] = Registry(
    "token advantage estimator", callable, "a function"
)


def register_policy_loss(name: str) -> Callable:
    """Decorator: register a policy loss under `name` (ValueError if taken).

    A policy loss has the signature
    `fn(old_logp, logp, advantages, mask, *, agg, clip_low, clip_high, clip_c, weights)
    -> (loss, metrics)`, taking only the options it uses, and its keyword defaults are the
    loss's own defaults: the one place they are written (the config's `null` means them;
    docs/configuration.md lists them, read from here). Hyper-parameters the config has no key
    for (SAPO's temperatures, Clip-Cov's bounds, ...) are further keywords with defaults.
    """
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable:
    return POLICY_LOSSES.get(name)


def register_advantage_estimator(name: str) -> Callable:
    """Decorator: register an advantage estimator under `name` (ValueError if taken).

    An estimator has the signature `fn(rewards: (N,), group_size: int, **kw) -> (N,)`.
    """
    return ADVANTAGE_ESTIMATORS.register(name)


def get_advantage_estimator(name: str) -> Callable:
    return ADVANTAGE_ESTIMATORS.get(name)


def register_token_advantage_estimator(name: str) -> Callable:
    """Decorator: register a token-level advantage estimator under `name` (ValueError if taken).

    A token estimator has the signature
    `fn(token_rewards: (B, T), mask: (B, T), **kw) -> (B, T)`.
    """
    return TOKEN_ADVANTAGE_ESTIMATORS.register(name)


def get_token_advantage_estimator(name: str) -> Callable:
    return TOKEN_ADVANTAGE_ESTIMATORS.get(name)


def advantage_kind(name: str) -> tuple[str, Callable]:
    """("token" | "outcome", the estimator) for `name`: a registered estimator, or a user's
    `package.module:function`, an outcome estimator unless its module registered it as a token
    one."""
    fn = ADVANTAGE_ESTIMATORS.merged(TOKEN_ADVANTAGE_ESTIMATORS).get(name)
    token_level = [TOKEN_ADVANTAGE_ESTIMATORS.entry(n) for n in TOKEN_ADVANTAGE_ESTIMATORS]
    return ("token" if fn in token_level else "outcome"), fn
