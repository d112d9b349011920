"""Which scoring forwards a run needs besides the training forward, from its config alone, so
that the sampler and the trainer agree without asking each other; and whether sampling may
overlap training.

- The old-policy pass gives the ratio's denominator. With one optimizer step per batch, taken
  with the weights that sampled the batch, the training forward computes the very same
  log-probs before its update: the ratio is 1 and the old log-probs are that forward's,
  detached. verl and OpenRLHF skip the pass in that case too.
- The reference pass feeds only the KL terms: without them it is dead work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo.config.sections import Config


@dataclass(frozen=True)
class ScoringPasses:
    old: bool  # a forward for the old-policy log-probs (else: the training forward's, detached)
    reference: bool  # a forward of the reference model


def one_step_per_batch(cfg: Config) -> bool:
    t = cfg.train
    batch = cfg.rollout.questions_per_step * cfg.rollout.group_size
    return t.ppo_epochs == 1 and (t.mini_batch_size == 0 or t.mini_batch_size >= batch)


def trained_with_sampling_weights(cfg: Config) -> bool:
    """Whether the trainer's weights before each step are those of the batch's old policy.

    Trainer-side scoring defines the old policy as exactly those weights. Sampler-side, they are
    the sampler's, which equal the trainer's only when every batch waits for the newest version:
    no staleness, every step published, and one sampler (with two, batch k of one may be
    trained after batches of the other)."""
    t = cfg.train
    if t.logprobs_on == "trainer":
        return True
    return t.max_staleness == 0 and t.sync_interval == 1 and cfg.rollout.num_samplers == 1


def scoring_passes(cfg: Config) -> ScoringPasses:
    algo = cfg.algo
    uses_kl = algo.kl_loss_coef > 0 or algo.kl_in_reward
    # KL in the reward, the rollout correction and OPD's advantages read the old log-probs
    # before the update.
    reads_old_early = (
        algo.kl_in_reward or algo.rollout_correction != "none" or algo.advantage == "opd"
    )
    old_is_training_forward = (
        one_step_per_batch(cfg) and trained_with_sampling_weights(cfg) and not reads_old_early
    )
    return ScoringPasses(old=not old_is_training_forward, reference=uses_kl)


SCORED_ARRAYS = ("old_logp", "ref_logp")  # what the old-policy and reference passes give


def scored_by(cfg: Config, role: str) -> frozenset[str]:
    """The arrays of SCORED_ARRAYS that `role` ("sampler" or "trainer") computes: those of the
    passes the run needs, on the role train.logprobs_on names. The one rule both roles and
    the trainer's admission of batches follow."""
    if cfg.train.logprobs_on != role:
        return frozenset()
    passes = scoring_passes(cfg)
    needed = dict(zip(SCORED_ARRAYS, (passes.old, passes.reference), strict=True))
    return frozenset(name for name, is_needed in needed.items() if is_needed)


def default_staleness(cfg: Config) -> int:
    """train.max_staleness when the config leaves it null: overlap (1) when the old log-probs
    are the sampling weights' (scored by the sampler), so the ratio corrects the lag; strictly
    on-policy (0) when the trainer scores them with its current weights."""
    return 1 if cfg.train.logprobs_on == "sampler" else 0
