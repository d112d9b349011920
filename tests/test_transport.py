"""Real ZeroMQ sockets on loopback: batches arrive, garbage is dropped and counted, silence ends."""

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zmq

from grpo.config import TransportConfig
from grpo.core.episode import Episode, EpisodeBatch
from grpo.delivery import rejection
from grpo.delivery.admission import Expected
from grpo.delivery.ledger import Ledger
from grpo.delivery.sampler_endpoint import SamplerEndpoint
from grpo.delivery.spool import Spool
from grpo.delivery.trainer_endpoint import TrainerEndpoint
from grpo.wire.channels import PeerError
from grpo.wire.codec import encode_batch
from grpo.wire.sampler_channel import SamplerChannel
from grpo.wire.trainer_channel import TrainerChannel
from tests.conftest import free_port


def _cfg(**kw) -> TransportConfig:
    return TransportConfig(
        episodes_addr=f"tcp://127.0.0.1:{free_port()}",
        control_addr=f"tcp://127.0.0.1:{free_port()}",
        heartbeat_s=0.1,
        **kw,
    )


def trainer_endpoint(cfg: TransportConfig, ledger: Ledger | None = None, version: int = 0):
    """The trainer's delivery endpoint (over its channel), for batches of 1 group of 2."""
    expected = Expected(groups=1, group_size=2, arrays=frozenset(), vocab_size=1000)
    return TrainerEndpoint(cfg, ledger or Ledger(), expected, version, max_held=4)


def sampler_endpoint(cfg: TransportConfig, spool_dir: Path, sampler_id: str = "s0"):
    """A sampler's delivery endpoint (over its channel), spooling into `spool_dir`."""
    return SamplerEndpoint(cfg, sampler_id, Spool(spool_dir, max_batches=8))


@contextmanager
def connected(**kw) -> Iterator[tuple[TrainerEndpoint, SamplerEndpoint]]:
    """The trainer's endpoint and a sampler's on fresh loopback ports, closed afterwards."""
    cfg = _cfg(**kw)
    trainer = trainer_endpoint(cfg)
    with tempfile.TemporaryDirectory() as spool_dir:
        sampler = sampler_endpoint(cfg, Path(spool_dir))
        try:
            yield trainer, sampler
        finally:
            sampler.close()
            trainer.close()


def _batch(seq: int, sampler_id: str = "sampler-0") -> EpisodeBatch:
    eps = tuple(
        Episode(
            np.arange(3, dtype=np.int32),
            np.arange(2, dtype=np.int32),
            np.zeros(2, np.float32),
            np.zeros(2, np.float32),
            float(i),
            {"correct": i == 0},
            "stop",
            7,
        )
        for i in range(2)
    )
    return EpisodeBatch(eps, 2, policy_version=0, seq=seq, sampler_id=sampler_id)


def test_batch_arrives_and_garbage_is_dropped():
    with connected(peer_timeout_s=5, startup_timeout_s=5) as (trainer, sampler):
        rogue = zmq.Context.instance().socket(zmq.PUSH)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(trainer.transport.episodes_addr)
        rogue.send_multipart([b"garbage", b"\x00" * 10])
        rogue.send(b"\x93\x01\x02")
        time.sleep(0.3)
        # PULL fair-queues across connections: keep receiving until the rogue's turn came twice.
        got = []
        for seq in range(6):
            sampler.send(_batch(seq), {"next_seq": seq + 1})
            got.append(trainer.receive_batch())
            if trainer.channel.rejected_frames == 2:
                break
        rogue.close()
        assert [b.seq for b in got] == list(range(len(got)))
        assert got[0].episodes[1].reward == 1.0
        assert trainer.channel.rejected_frames == 2
        trainer.channel.announce("version", version=4)
        deadline = time.monotonic() + 5
        while sampler.status.version != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sampler.status.seen and sampler.status.version == 4
        assert sampler.spool.pending() == list(range(len(got)))  # spooled: none acknowledged
        trainer.channel.announce("done", version=4)
        assert sampler.stopped.wait(5) and sampler.status.done


def test_trainer_gives_up_on_a_silent_sampler():
    """Across calls too: the trainer waits in slices (receive_batch(wait_s=...), to keep its
    other ranks alive), and a new slice must not restart the startup clock."""
    trainer = trainer_endpoint(_cfg(peer_timeout_s=1, startup_timeout_s=1.5))
    deadline = time.monotonic() + 10
    try:
        with pytest.raises(PeerError, match="no message yet from any sampler"):
            while time.monotonic() < deadline:
                trainer.receive_batch(wait_s=0.5)
    finally:
        trainer.close()


def test_made_up_ids_heartbeating_do_not_switch_off_the_startup_timeout():
    """Issue 62, finding 6: heartbeats under made-up ids once stopped the start-up clock for
    good. It now runs until a sampler the trainer trusts is there (its first batch admitted),
    and the error names the ids heard meanwhile."""
    cfg = _cfg(peer_timeout_s=30, startup_timeout_s=1.5)
    trainer = trainer_endpoint(cfg)
    fakes = [SamplerChannel(cfg, f"fake-{i}") for i in range(4)]
    deadline = time.monotonic() + 10
    try:
        with pytest.raises(PeerError, match=r"no batch this trainer could take for \d s .*"
                           r"though it heard from fake-0, fake-1, fake-2 and 1 more"):  # fmt: skip
            while time.monotonic() < deadline:
                trainer.receive_batch(wait_s=0.5)
    finally:
        for fake in fakes:
            fake.close()
        trainer.close()


def test_sampler_notices_a_dead_trainer():
    with connected(peer_timeout_s=1, startup_timeout_s=30) as (trainer, sampler):
        deadline = time.monotonic() + 5
        while not sampler.status.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sampler.status.seen
        trainer.close()  # heartbeats stop (closing twice is harmless)
        assert sampler.stopped.wait(5)
        assert "no heartbeat from the trainer" in sampler.status.stop_reason


def test_the_last_samplers_stop_ends_the_trainer_with_its_reason():
    with connected(peer_timeout_s=5, startup_timeout_s=5) as (trainer, sampler):
        sampler.stop("trainer stopped: it went away")  # not told back to the trainer
        sampler.stop("interrupted by SIGINT")
        with pytest.raises(
            PeerError, match="^no sampler left: sampler s0 stopped: interrupted by SIGINT$"
        ):
            trainer.receive_batch()


def test_a_stop_or_silence_drops_one_sampler_and_the_others_go_on():
    """Samplers are a pool: one stopping or going silent is dropped by name, with what it was
    last doing; batches from the others still arrive; the run ends when none is left."""
    with connected(peer_timeout_s=1.0, startup_timeout_s=5) as (trainer, s0):
        s1, s2 = SamplerChannel(trainer.transport, "s1"), SamplerChannel(trainer.transport, "s2")
        try:
            deadline = time.monotonic() + 5
            while len(trainer.pool.alive()) < 3 and time.monotonic() < deadline:
                trainer.receive_batch(wait_s=0.2)
            assert trainer.pool.alive() == ["s0", "s1", "s2"]
            s1.send_stop("crashed: RuntimeError: boom")
            s2.close()  # silent from now on
            s0.send(_batch(0, "s0"), {})
            assert trainer.receive_batch().sampler_id == "s0"  # not ended by s1's stop
            assert trainer.receive_batch(wait_s=2.5) is None  # s2 is dropped meanwhile
            assert trainer.pool.alive() == ["s0"]
            why = {sid: m.why for sid, m in trainer.pool.members.items()}
            assert why["s1"] == "sampler s1 stopped: crashed: RuntimeError: boom"
            assert why["s2"].startswith("sampler s2 dropped: silent for 1 s (limit 1 s); last ")
            s0.stop("done here")
            with pytest.raises(PeerError, match="^no sampler left: .*s0 stopped: done here"):
                trainer.receive_batch()
        finally:
            s1.close()
            s2.close()


def test_port_in_use_is_a_clear_error():
    cfg = _cfg()
    first = TrainerChannel(cfg)
    try:
        with pytest.raises(PeerError, match="cannot bind the episodes socket"):
            TrainerChannel(cfg)
    finally:
        first.close()


def test_queued_heartbeats_count_after_a_long_training_step():
    """A step longer than peer_timeout_s must not read as a dead sampler: its heartbeats (and
    next batch) are queued, not missing."""
    with connected(peer_timeout_s=1, startup_timeout_s=5) as (trainer, sampler):
        sampler.send(_batch(0), {})
        assert trainer.receive_batch().seq == 0
        time.sleep(1.5)  # "training"
        sampler.send(_batch(1), {})
        assert trainer.receive_batch().seq == 1


def test_recv_returns_none_after_wait_while_the_sampler_lives():
    with connected(peer_timeout_s=5, startup_timeout_s=5) as (trainer, sampler):
        started = time.monotonic()
        assert trainer.receive_batch(wait_s=1.0) is None
        assert 1.0 <= time.monotonic() - started < 3.0


def test_oversized_batch_is_refused_by_the_sender():
    big = np.zeros(300_000, np.int32)
    zeros = np.zeros(2, np.float32)
    eps = tuple(
        Episode(big, np.arange(2, dtype=np.int32), zeros, zeros, 0.0, {}, "stop", 1)
        for _ in range(2)
    )
    limits = dict(peer_timeout_s=5, startup_timeout_s=5, max_frame_bytes=1 << 20)
    with connected(**limits) as (_, sampler):
        with pytest.raises(PeerError, match="over transport.max_frame_bytes"):
            sampler.send(EpisodeBatch(eps, 2, policy_version=0, seq=0), {})
        assert sampler.spool.pending() == []  # refused before it was spooled


def test_a_rejected_batch_stops_only_the_sampler_that_sent_it():
    with connected(peer_timeout_s=5, startup_timeout_s=5) as (trainer, sampler):
        deadline = time.monotonic() + 5
        while not sampler.status.seen and time.monotonic() < deadline:  # subscribed by now
            time.sleep(0.05)
        own = encode_batch(_batch(4, "s0"))
        sampler.spool.put(4, own)
        for sampler_id, seq, frames in [
            ("another", 4, own),  # another sampler's id
            ("s0", 4, encode_batch(_batch(4, "s1"))),  # a batch others sent under its seq
            ("s0", 3, own),  # a seq it has not spooled
        ]:
            sealed = rejection.seal(frames, "wrong shape")
            trainer.channel.announce("rejected", sampler_id=sampler_id, seq=seq, **sealed)
        # Sealed for another batch but claiming the reason in the clear, as a peer might.
        trainer.channel.announce("rejected", sampler_id="s0", seq=4, reason="made up")
        time.sleep(0.5)
        assert not sampler.stopped.is_set(), sampler.status.stop_reason
        assert sampler.others_rejected == 3
        sealed = rejection.seal(own, "it has 2 groups of 2")
        trainer.channel.announce("rejected", sampler_id="s0", seq=4, **sealed)
        assert sampler.stopped.wait(5)
        assert sampler.status.stop_reason == "the trainer rejected batch 4: it has 2 groups of 2"
        assert not sampler.status.done


def test_a_stalled_trainer_stops_its_samplers_naming_the_phase():
    """The trainer's main thread stuck in a working phase (its heartbeats go on): after
    stall_timeout_s its own watchdog stops the samplers with the phase named."""
    from grpo.runtime.progress import ACTIVITY, TRAINING

    with (
        ACTIVITY.during(TRAINING, "step 7"),
        connected(peer_timeout_s=5, startup_timeout_s=5, stall_timeout_s=0.5) as (_, sampler),
    ):
        sampler.channel.watchdog.limit_s = 0  # one process here: only the trainer's watches
        assert sampler.stopped.wait(10)
    assert sampler.status.stop_reason.startswith(
        "trainer stopped: trainer: no progress in training (step 7) for "
    ), sampler.status.stop_reason
