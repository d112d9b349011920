"""Does a well-formed batch fit this trainer? Decoding proved the frames are a batch whose
values are sane on their own (grpo.core.columns: token ids >= 0, prompts not empty, rewards and
log-probs finite and bounded, stats finite); this checks it against the run: its shape, its
log-probs, its vocabulary and its lengths, and the fields the trainer's metrics read. A batch
that does not fit is dropped and its sampler told why, rather than stopping every rank in the
middle of a step."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from grpo.config import Config
from grpo.config.passes import SCORED_ARRAYS
from grpo.core.columns import is_finite_real
from grpo.core.episode import EpisodeBatch
from grpo.core.staleness import lag_misfit
from grpo.delivery.ledger import Ledger
from grpo.runtime.refusals import note

log = logging.getLogger("grpo.trainer")

# Reward-info keys the trainer's metrics row averages as numbers (grpo.trainer.outputs
# .tool_metrics: float() of each), so a batch must carry numbers there or nothing.
NUMERIC_INFO = ("turns", "tool_calls", "tool_errors")
# Stat names the metrics row cannot take: it writes a stat `k` as `sampler_k`, and
# `sampler_id` is the row's own (which sampler sent the batch).
RESERVED_STATS = frozenset({"id"})


@dataclass(frozen=True)
class Expected:
    groups: int  # rollout.questions_per_step: DeepSpeed's accumulation steps depend on it
    group_size: int
    arrays: frozenset[str]  # the log-probs the sampler computes: passes.scored_by(cfg, "sampler")
    vocab_size: int  # token ids at or above it would index past the embedding table
    # data.max_prompt_tokens and rollout.max_new_tokens: a longer prompt or answer than the
    # run samples is no answer of this run, and an unbounded one runs the trainer out of
    # memory. None: not checked (a test's trainer with no config); see for_run.
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    # train.total_steps: the newest weights version the run can publish (version s is the
    # weights after step s), so no token was sampled with a newer one. Not the trainer's current
    # version: a restarted trainer is resent batches sampled from versions of the crashed run
    # that it republishes. None: not checked.
    max_version: int | None = None
    # train.max_staleness and train.sync_interval: the versions a batch may be sampled with
    # (only multiples of sync_interval are published before the last step), and the lag
    # checked when it is trained (grpo.core.staleness.lag_misfit). None: not checked.
    max_staleness: int | None = None
    sync_interval: int = 1

    @classmethod
    def for_run(cls, cfg: Config, arrays: frozenset[str], vocab_size: int) -> Expected:
        """What this run's trainer takes: `arrays` as the plan scores them on the sampler,
        `vocab_size` the policy's embedding rows."""
        r = cfg.rollout
        return cls(
            groups=r.questions_per_step,
            group_size=r.group_size,
            arrays=arrays,
            vocab_size=vocab_size,
            max_prompt_tokens=cfg.data.max_prompt_tokens,
            max_new_tokens=r.max_new_tokens,
            max_version=cfg.train.total_steps,
            max_staleness=cfg.train.max_staleness,
            sync_interval=cfg.train.sync_interval,
        )


def misfit(batch: EpisodeBatch, want: Expected) -> str | None:
    """Why the trainer cannot train on ``batch`` (a message naming the field, and the config
    key to align when the two roles disagree), or None when it fits."""
    got = (batch.num_groups, batch.group_size)
    if got != (want.groups, want.group_size):
        return (
            f"it has {got[0]} groups of {got[1]}, but the trainer expects {want.groups} groups "
            f"of {want.group_size}: start the sampler and the trainer with the same "
            "rollout.questions_per_step and rollout.group_size"
        )
    for name in SCORED_ARRAYS:
        has = getattr(batch.columns, name) is not None
        if has != (name in want.arrays):
            return (
                f"it {'has' if has else 'lacks'} {name}, but this trainer expects "
                f"{'it' if name in want.arrays else 'none'} (train.logprobs_on and the passes "
                "the algo section needs): start both roles with the same config"
            )
    return _version_misfit(batch, want) or _token_misfit(batch, want) or _metrics_misfit(batch)


def _version_misfit(batch: EpisodeBatch, want: Expected) -> str | None:
    """A version this run publishes for sampling: 0, then every train.sync_interval steps, up
    to train.total_steps."""
    v, last, every = batch.policy_version, want.max_version, want.sync_interval
    if v < 0 or v % every or (last is not None and v > last):
        return (
            f"it claims to be sampled with version {v}, which this run never publishes for "
            f"sampling (0, then every train.sync_interval={every} steps"
            + (f", up to train.total_steps={last})" if last is not None else ")")
        )
    return None


def _token_misfit(batch: EpisodeBatch, want: Expected) -> str | None:
    """Token ids within [0, vocab), lengths within the run's maxima, token versions within
    the run's."""
    c = batch.columns
    for name in ("prompt_ids", "completion_ids"):
        ids = getattr(c, name)
        if not ids.size:
            continue
        low, top = int(ids.min()), int(ids.max())
        if low < 0:  # refused by decoding already; kept so that this check is whole alone
            return f"its {name} holds token id {low}, below 0"
        if top >= want.vocab_size:
            return (
                f"its {name} holds token id {top}, beyond the model's {want.vocab_size} "
                "embeddings: start the sampler and the trainer with the same model.path"
            )
    for lens, key, limit in (
        (c.prompt_len, "data.max_prompt_tokens", want.max_prompt_tokens),
        (c.completion_len, "rollout.max_new_tokens", want.max_new_tokens),
    ):
        if limit is not None and lens.size and (longest := int(lens.max())) > limit:
            return (
                f"it holds a {'prompt' if key.startswith('data') else 'completion'} of "
                f"{longest} tokens, over the trainer's {key}={limit}: start both roles with "
                f"the same {key}"
            )
    versions, last = c.token_versions, want.max_version
    if last is not None and versions is not None and versions.size:
        newest = int(versions.max())
        if newest > last:
            return (
                f"its token_versions hold version {newest}, past the last this run publishes "
                f"(train.total_steps={last}): start both roles with the same config"
            )
    return None


def _metrics_misfit(batch: EpisodeBatch) -> str | None:
    """Fields the trainer's metrics row reads as they are: stat names, numeric infos."""
    if reserved := sorted(RESERVED_STATS & batch.stats.keys()):
        return f"its stats name {reserved}, which the metrics row keeps for itself"
    for info in batch.columns.reward_info:
        for key in NUMERIC_INFO:
            value = info.get(key)
            if value is not None and not is_finite_real(value):
                return f"its reward_info[{key!r}] is {value!r:.40}, not a finite number"
    return None


class StalenessGate:
    """The staleness bound, judged when a batch is about to be trained: it must have been
    sampled with weights the bound allows for that step (grpo.core.staleness.lag_misfit). A
    lone sampler's pacing is exact, so its batch outside the bound is a lie or a bug: refused.
    A pool's pacing is an estimate (grpo.sampler.loop.expected_batch: a slow sampler's batch
    can be trained later than it expected), so there such a batch is trained, counted
    (`outside`, in the metrics row as stale_batches) and reported at a bounded rate."""

    def __init__(self, want: Expected):
        self.want, self.outside = want, 0

    def refusal(self, batch: EpisodeBatch, ledger: Ledger, held: Iterable[str]) -> str | None:
        """Why `batch` may not be trained next, or None. `ledger`: what was trained (a batch a
        step); `held`: the samplers with batches waiting for their predecessors. The sampler is
        lone when no other one's batch was ever trained or held in this run."""
        step = sum(len(seqs) for seqs in ledger.consumed.values())
        lone = ledger.consumed.keys() | set(held) <= {batch.sampler_id}
        m, versions = self.want.max_staleness, batch.columns.token_versions
        newest = int(versions.max()) if versions is not None and versions.size else None
        why = (
            None
            if m is None
            else lag_misfit(batch.policy_version, step, m, self.want.sync_interval, newest)
        )
        if why is None or lone:
            return why
        self.outside += 1
        note(
            log,
            self.outside,
            "training batch %d from %s outside the staleness bound (%d so "
            "far; a pool's pacing is an estimate): %s",
            batch.seq,
            batch.sampler_id,
            self.outside,
            why,
        )
        return None
