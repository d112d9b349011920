"""A well-formed batch the trainer cannot train on is named, with the config key to align."""

from dataclasses import replace

import numpy as np
import pytest

from grpo.core.episode import EpisodeBatch
from grpo.delivery.admission import Expected, misfit
from tests.test_episode import make_batch

SCORED = frozenset({"old_logp", "ref_logp"})
FITS = Expected(groups=3, group_size=4, arrays=SCORED, vocab_size=50_000)


def _with_columns(batch: EpisodeBatch, **columns: np.ndarray | None) -> EpisodeBatch:
    return EpisodeBatch.from_columns(
        replace(batch.columns, **columns), batch.group_size, batch.policy_version, batch.seq
    )


def test_a_batch_of_the_configured_shape_fits():
    assert misfit(make_batch(), FITS) is None


@pytest.mark.parametrize(
    ("want", "key"),
    [
        (replace(FITS, groups=2), "rollout.questions_per_step"),
        (replace(FITS, group_size=2), "rollout.group_size"),
        (replace(FITS, arrays=frozenset()), "has old_logp, but this trainer expects none"),
        (replace(FITS, vocab_size=100), "model.path"),
    ],
)
def test_a_batch_that_does_not_fit_names_the_key(want, key):
    why = misfit(make_batch(), want)
    assert why is not None and key in why


def test_a_batch_without_logprobs_does_not_fit_a_trainer_expecting_them():
    batch = _with_columns(make_batch(), old_logp=None, ref_logp=None)
    assert "lacks old_logp" in misfit(batch, FITS)
    assert misfit(batch, replace(FITS, arrays=frozenset())) is None


def test_each_skipped_pass_is_expected_on_its_own():
    """No reference pass (no KL term): old-policy log-probs only, and the reverse."""
    only_old = _with_columns(make_batch(), ref_logp=None)
    assert misfit(only_old, replace(FITS, arrays=frozenset({"old_logp"}))) is None
    assert "lacks ref_logp" in misfit(only_old, FITS)
    only_ref = _with_columns(make_batch(), old_logp=None)
    assert misfit(only_ref, replace(FITS, arrays=frozenset({"ref_logp"}))) is None


def test_the_largest_token_id_must_index_an_embedding():
    batch = make_batch()
    top = int(max(batch.columns.prompt_ids.max(), batch.columns.completion_ids.max()))
    assert misfit(batch, replace(FITS, vocab_size=top + 1)) is None
    assert f"token id {top}" in misfit(batch, replace(FITS, vocab_size=top))


@pytest.mark.parametrize("name", ["old_logp", "ref_logp", "rollout_logp"])
def test_a_log_prob_that_is_not_finite_is_no_batch(name):
    """Refused before admission, by the batch itself (grpo.core.columns), so that a sampler
    cannot build one either (issue 29, finding 4)."""
    batch = make_batch()
    values = getattr(batch.columns, name).copy()
    values[len(values) // 2] = np.nan
    with pytest.raises(ValueError, match=f"batch 17 from 'sampler-0': {name} holds nan"):
        _with_columns(batch, **{name: values})


def test_a_multi_turn_batch_with_its_loss_mask_fits():
    """The mask describes its own batch (which tokens the model sampled): a trainer takes it
    whatever its own rollout.max_turns, and masks the tool's tokens."""
    batch = make_batch(mask=True)
    assert batch.columns.loss_mask is not None and misfit(batch, FITS) is None
