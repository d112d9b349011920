"""The staleness bound (train.max_staleness) as both ends apply it: the sampler waits for the
oldest version a batch may be sampled with (`required_version`); the trainer checks, when it
trains a batch, that the version it was sampled with lies within the bound (`lag_misfit`)."""

from __future__ import annotations


def required_version(seq: int, max_staleness: int, sync_interval: int) -> int:
    """The oldest weights batch `seq` may be sampled with.

    Batch k is trained at step k + 1, so with no lag it needs version k; `max_staleness` allows
    that many versions of lag, and only multiples of `sync_interval` are ever published.
    """
    return max(0, (seq - max_staleness) // sync_interval * sync_interval)


def lag_misfit(
    version: int, step: int, max_staleness: int, sync_interval: int, newest: int | None = None
) -> str | None:
    """Why a batch sampled with weights `version` (with continuous generation its oldest
    token's; `newest`: its newest token's) may not be trained at step `step` + 1 (the trainer
    holding version `step`), or None: the weights must be the trainer's or older (no token is
    sampled with weights not yet made), and no older than the bound allows."""
    if newest is not None and newest > step:
        return (
            f"it holds a token of version {newest}, newer than the trainer's weights "
            f"(version {step})"
        )
    if version > step:
        return (
            f"it claims to be sampled with version {version}, newer than the trainer's "
            f"weights (version {step})"
        )
    oldest = required_version(step, max_staleness, sync_interval)
    if version < oldest:
        return (
            f"it was sampled with version {version}, {step - version} behind the trainer's "
            f"{step}: train.max_staleness={max_staleness} (train.sync_interval="
            f"{sync_interval}) allows version {oldest} or newer"
        )
    return None
