"""The staleness bound is the trainer's rule, not only the sampler's promise (issue 43, finding
2): a batch's version claim is checked against the versions the run publishes when it arrives,
and against the step about to train it; a lone sampler's batch outside the bound is refused (a
lie or a bug: its pacing is exact), a pool's is trained and counted (its pacing is an estimate)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from grpo.core.episode import Episode, EpisodeBatch
from grpo.core.staleness import lag_misfit, required_version
from grpo.delivery.admission import Expected, StalenessGate, misfit
from grpo.delivery.ledger import Ledger
from grpo.wire.channels import PeerError
from tests.test_edge_validation import _endpoints

WANT = Expected(groups=1, group_size=2, arrays=frozenset(), vocab_size=1000, max_version=12,
                max_staleness=2, sync_interval=2)  # fmt: skip


def _batch(
    seq: int, version: int, sampler_id: str = "sampler-0", token_versions: list[int] | None = None
) -> EpisodeBatch:
    versions = None if token_versions is None else np.array(token_versions, np.int64)
    eps = [Episode(np.arange(3, dtype=np.int32), np.arange(2, dtype=np.int32), None, None,
                   float(i), {}, "stop", 7, token_versions=versions) for i in range(2)]  # fmt: skip
    return EpisodeBatch(eps, 2, policy_version=version, seq=seq, sampler_id=sampler_id)


def _trained(steps: dict[str, int]) -> Ledger:
    """A ledger that trained `steps[sid]` batches of each sampler (one a step)."""
    ledger = Ledger()
    for sid, n in steps.items():
        for seq in range(n):
            ledger.consume(sid, seq)
    return ledger


@pytest.mark.parametrize(("max_staleness", "sync_interval"), [(0, 1), (2, 1), (1, 2), (4, 3)])
def test_the_trainer_takes_exactly_the_versions_the_sampler_waits_for(max_staleness, sync_interval):
    """At every step, the oldest version the trainer takes is the one a lone sampler waits for
    before sampling the batch that step trains; the newest, the trainer's own weights."""
    for step in range(12):
        oldest = required_version(step, max_staleness, sync_interval)
        for version in range(0, 14):
            why = lag_misfit(version, step, max_staleness, sync_interval)
            assert (why is None) == (oldest <= version <= step), (step, version, why)
    assert "newer than the trainer's weights (version 3)" in lag_misfit(4, 3, 0, 1)
    assert "allows version 3 or newer" in lag_misfit(1, 5, 2, 1)
    # Continuous generation: the oldest token is the batch's version; the newest must exist too.
    assert lag_misfit(3, 5, 2, 1, newest=5) is None
    assert "a token of version 6, newer than" in lag_misfit(3, 5, 2, 1, newest=6)


@pytest.mark.parametrize("version", [-5, 10**15, 3, 14])
def test_a_version_the_run_never_publishes_for_sampling_is_refused_when_it_arrives(version):
    """-5, 10^15, an odd version with sync_interval 2, one past the last step: none can have
    sampled a batch of this run."""
    why = misfit(_batch(0, version), WANT)
    assert why is not None and f"version {version}, which this run never publishes" in why
    assert misfit(_batch(0, 10), WANT) is None


def test_the_gate_judges_a_continuous_batch_by_its_newest_token_too() -> None:
    """Continuous generation: the batch's version is its oldest token's; a token sampled with
    weights the trainer has not made yet (its newest) refuses the batch, whatever its oldest."""
    gate = StalenessGate(WANT)
    ledger = _trained({"sampler-0": 4})  # the trainer holds version 4
    for newest, refused in ((4, False), (6, True)):
        why = gate.refusal(_batch(4, 2, token_versions=[2, newest]), ledger, {})
        assert (why is not None) == refused, why
        assert not refused or "a token of version 6, newer than the trainer's weights" in why


def test_a_lone_sampler_outside_the_bound_is_refused_and_a_pool_s_is_counted():
    gate = StalenessGate(WANT)
    ledger = _trained({"sampler-0": 6})  # the trainer holds version 6: 4 and 6 are in bounds
    assert gate.refusal(_batch(6, 4), ledger, {}) is None
    assert gate.refusal(_batch(6, 6), ledger, {}) is None
    assert "allows version 4 or newer" in gate.refusal(_batch(6, 2), ledger, {})
    assert "newer than the trainer's weights" in gate.refusal(_batch(6, 8), ledger, {})
    # At step 7 the bound reaches back to the last version published (sync_interval 2): 4,
    # which a bound counted in steps (5) would refuse.
    assert gate.refusal(_batch(7, 4), _trained({"sampler-0": 7}), {}) is None
    assert "allows version 4 or newer" in gate.refusal(_batch(7, 3), _trained({"sampler-0": 7}), {})
    assert gate.outside == 0
    # The same from a pool: sampler-1 had batches trained, or one held.
    for pool, held in ((_trained({"sampler-0": 4, "sampler-1": 2}), {}),
                       (ledger, {"sampler-1": {}})):  # fmt: skip
        assert gate.refusal(_batch(6, 2), pool, held) is None
    assert gate.outside == 2


def test_a_lone_sampler_lying_about_its_version_is_stopped_by_the_trainer(tmp_path):
    """Over real sockets: sampler-0's batch 0 (version 0) is trained; its batch 1 claims
    version 0 with train.max_staleness 0 at step 1, so the trainer refuses it at training time
    and the sampler stops with the reason."""
    trainer, sampler = _endpoints(tmp_path)
    trainer.staleness = StalenessGate(Expected(groups=1, group_size=2, arrays=frozenset(),
                                               vocab_size=1000, max_staleness=0))  # fmt: skip
    try:
        sampler.wait_for_trainer()
        sampler.send(_batch(0, 0), {"next_seq": 1})
        assert trainer.next_batch(lambda: None).seq == 0
        trainer.ledger.consume("sampler-0", 0)
        sampler.send(_batch(1, 0), {"next_seq": 2})
        ended: list[BaseException] = []

        def take() -> None:
            try:
                trainer.next_batch(lambda: None)
            except PeerError as e:  # the sampler stopped: none left
                ended.append(e)

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        assert sampler.stopped.wait(10)
        reason = sampler.status.stop_reason
        assert reason.startswith("the trainer rejected batch 1: it was sampled with version 0, "
                                 "1 behind the trainer's 1"), reason  # fmt: skip
        assert trainer.counters()["rejected_batches"] == 1
        sampler.stop(reason)  # as the sampler's loop does: the trainer has no sampler left
        taker.join(10)
        assert ended and 1 not in trainer.ledger.consumed["sampler-0"]
    finally:
        sampler.close()
        trainer.close()


def test_a_batch_admitted_vouches_for_its_sampler(tmp_path):
    """Over real sockets: sampler-0's heartbeats make it known, not counted; its first batch
    admitted makes it count in what the samplers are told (grpo.delivery.pool)."""
    trainer, sampler = _endpoints(tmp_path)
    try:
        sampler.wait_for_trainer()
        for _ in range(50):  # its heartbeats, read
            if trainer.pool.alive():
                break
            trainer.receive_batch(wait_s=0.1)
        assert trainer.pool.alive() == ["sampler-0"] and trainer.pool.counted() == []
        sampler.send(_batch(0, 0), {"next_seq": 1})
        assert trainer.next_batch(lambda: None).seq == 0
        assert trainer.pool.counted() == ["sampler-0"] and trainer._status["alive"] == 1
    finally:
        sampler.close()
        trainer.close()
