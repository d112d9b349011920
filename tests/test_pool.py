"""The pool of samplers as the trainer sees it, the progress a heartbeat carries, and how a
sampler paces itself without a quota: pure logic on a fake clock."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from grpo.core.staleness import required_version
from grpo.delivery.pool import SamplerPool
from grpo.runtime.progress import GENERATING, WAITING, Activity, Snapshot, StallClock, Watchdog
from grpo.sampler.loop import expected_batch
from grpo.weights.modes.base import Vouched
from grpo.weights.modes.stream import MemoryServer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def beat(phase: str, count: int, incarnation: str = "a", detail: str = "batch 3") -> dict:
    return {"incarnation": incarnation, **Snapshot(phase, detail, count).to_json()}


def test_stall_clock_counts_only_working_phases_without_progress():
    clock = Clock()
    stall = StallClock(clock)
    stall.see(Snapshot(GENERATING, "batch 3", 10))
    clock.now = 5.0
    stall.see(Snapshot(GENERATING, "batch 3", 10))
    assert stall.stalled(4.0) == "no progress in generating (batch 3) for 5 s (limit 4 s)"
    assert stall.stalled(0) is None  # 0: never
    stall.see(Snapshot(GENERATING, "batch 3", 11))  # progress resets the clock
    assert stall.stalled(4.0) is None
    stall.see(Snapshot(WAITING, "for version 4", 11))
    clock.now = 100.0
    assert stall.stalled(4.0) is None  # waiting is never a stall


def test_activity_during_restores_the_phase_and_keeps_the_count():
    activity = Activity()
    activity.enter(WAITING, "for a batch")
    with activity.during(GENERATING, "batch 1"):
        activity.tick(3)
        assert activity.snapshot() == Snapshot(GENERATING, "batch 1", 3)
    assert activity.snapshot() == Snapshot(WAITING, "for a batch", 3)


def test_watchdog_fires_once_with_the_reason(monkeypatch):
    activity = Activity()
    monkeypatch.setattr("grpo.runtime.progress.ACTIVITY", activity)
    clock = Clock()
    fired: list[str] = []
    dog = Watchdog(2.0, fired.append)
    dog.clock = StallClock(clock)
    activity.enter(GENERATING, "batch 0")
    dog.check()
    clock.now = 3.0
    dog.check()
    dog.check()
    assert fired == ["no progress in generating (batch 0) for 3 s (limit 2 s)"]


def test_snapshot_from_a_malformed_body_is_none():
    assert Snapshot.from_json({"phase": "generating", "progress": "many"}) is None
    assert Snapshot.from_json({}) is None


def make_pool() -> tuple[SamplerPool, Clock]:
    clock = Clock()
    return SamplerPool(peer_timeout_s=10.0, stall_timeout_s=20.0, clock=clock), clock


def test_a_silent_sampler_is_dropped_with_its_last_activity_and_back_when_heard():
    pool, clock = make_pool()
    pool.heard("s0", beat(GENERATING, 5))
    pool.heard("s1", beat(GENERATING, 7, "b"))
    clock.now = 11.0
    pool.heard("s0", beat(GENERATING, 9))
    pool.check()
    assert pool.alive() == ["s0"]
    assert pool.members["s1"].why == (
        "sampler s1 dropped: silent for 11 s (limit 10 s); last seen generating (batch 3)"
    )
    pool.heard("s1", beat(GENERATING, 7, "b"))  # it was slow, not dead
    assert pool.alive() == ["s0", "s1"]


def test_a_stalled_sampler_is_dropped_by_phase_and_back_when_it_progresses():
    pool, clock = make_pool()
    for t in range(0, 25, 2):  # heartbeats keep coming, the counter does not move
        clock.now = float(t)
        pool.heard("s0", beat(GENERATING, 5))
        pool.check()
    assert pool.alive() == []
    assert pool.members["s0"].why == (
        "sampler s0 dropped: no progress in generating (batch 3) for 22 s (limit 20 s)"
    )
    assert pool.none_left() == "no sampler left: " + pool.members["s0"].why
    pool.heard("s0", beat(GENERATING, 5))  # the same: still stalled
    assert pool.alive() == []
    pool.heard("s0", beat(GENERATING, 6))
    assert pool.alive() == ["s0"]


def test_a_stopped_sampler_comes_back_only_as_a_new_process():
    pool, _ = make_pool()
    pool.heard("s0", beat(GENERATING, 1, "first"))
    pool.stopped("s0", "crashed: ValueError: x", "first")
    pool.heard("s0", beat(GENERATING, 2, "first"))  # a heartbeat sent before its stop
    assert pool.alive() == []
    assert pool.none_left() == "no sampler left: sampler s0 stopped: crashed: ValueError: x"
    pool.heard("s0", beat(WAITING, 0, "second"))  # restarted with --resume
    assert pool.alive() == ["s0"] and pool.none_left() is None


@pytest.mark.parametrize(
    "sid", ["!", "['s0']", "", "x" * 300], ids=["bang", "list", "empty", "long"]
)
def test_a_stop_in_a_name_no_sampler_has_is_ignored_not_a_crash(sid, caplog):
    """Issue 62, finding 4: a stop whose sampler_id is no sampler id raised KeyError in the
    trainer; now it is refused as any message in such a name, and a real stop's reason is
    logged cut to a bound."""
    pool, _ = make_pool()
    pool.heard("s0", beat(GENERATING, 1))
    pool.stopped(sid, "forged")
    assert pool.alive() == ["s0"] and pool.refused == 1  # refused once, as any message
    pool.stopped("s0", "y" * 4_000_000, "a")
    assert pool.alive() == [] and max(len(r.getMessage()) for r in caplog.records) < 400


def test_no_sampler_heard_yet_is_not_none_left():
    pool, _ = make_pool()
    assert pool.none_left() is None


@pytest.mark.parametrize("made", range(6))
def test_a_lone_sampler_expects_exactly_its_own_count(made):
    for trained in range(made + 1):  # however far the trainer is, the answer is the same
        assert expected_batch({"s0": trained} if trained else {}, "s0", made, alive=1) == made


def test_samplers_in_a_pool_interleave_and_a_dead_ones_share_is_taken_over():
    # Three alive, each with one batch on the way: ours comes after one round of them.
    trained = {"s0": 2, "s1": 2, "s2": 2}
    assert expected_batch(trained, "s0", made=3, alive=3) == 6 + 3
    # s2 died; with nothing of ours on the way our next batch is the trainer's next one,
    # so the version it needs is out (no wait for a version only our batch could bring).
    trained = {"s0": 3, "s1": 4, "s2": 2}
    step = expected_batch(trained, "s0", made=3, alive=2)
    assert step == 9
    assert required_version(step, max_staleness=0, sync_interval=1) == sum(trained.values())


def test_an_id_that_is_no_sampler_id_or_one_past_the_pool_s_bound_is_not_taken():
    """Every trainer control message carries the pool (relays, acknowledgements): two made-up
    ids of 0.6 x max_frame_bytes once pushed every one over the limit and every sampler
    stopped. Ids are bounded (grpo.core.names), and so is the pool."""
    from grpo.delivery.pool import MAX_MEMBERS

    pool = SamplerPool(peer_timeout_s=10, stall_timeout_s=10)
    for sid in ("x" * 600_000, "", "../spool", "a b", "-lead"):
        pool.heard(sid, {"weights": {"relay": "tcp://127.0.0.1:1"}, "incarnation": "i"})
    assert pool.members == {} and pool.refused == 5
    keyed = SamplerPool(peer_timeout_s=10, stall_timeout_s=10, authenticated=True)
    for i in range(MAX_MEMBERS + 10):
        keyed.heard(f"s{i}")
    assert len(keyed.members) == MAX_MEMBERS and keyed.refused == 10
    keyed.heard("s0", {"incarnation": "j"})  # a member already there is still heard
    assert keyed.members["s0"].incarnation == "j"


def test_a_flood_of_made_up_ids_never_keeps_a_real_sampler_out_nor_decides_the_run(caplog):
    """Issue 62, finding 6: 1,024 heartbeats under made-up ids filled the pool for the
    trainer's life, so a real sampler heard after them was never counted; once the fakes went
    silent the run ended with "no sampler left" while that sampler was still sending, and live
    fakes kept a run whose samplers were gone from ever ending. Ids not vouched for now live in
    a table of MAX_UNVOUCHED whose oldest is evicted, and do not count once one is vouched."""
    from grpo.delivery.pool import MAX_UNVOUCHED

    caplog.set_level(logging.INFO)
    pool, clock = make_pool()
    for i in range(1024):
        pool.heard(f"fake-{i}", beat(GENERATING, i))
    assert len(pool.members) == MAX_UNVOUCHED and pool.evicted == 1024 - MAX_UNVOUCHED
    clock.now = 1.0
    pool.heard("real", beat(GENERATING, 1, "r"))
    pool.heard("fake-late", beat(GENERATING, 1))  # the table full: the oldest id goes, not
    assert "real" in pool.members and "fake-960" not in pool.members  # the newest
    pool.vouch("real")  # its first batch admitted
    for i in range(1024, 2048):  # more fakes: never the vouched one evicted
        pool.heard(f"fake-{i}", beat(GENERATING, i))
    assert pool.counted() == ["real"] and len(pool.members) == MAX_UNVOUCHED + 1
    clock.now = 12.0
    pool.heard("real", beat(GENERATING, 2, "r"))
    pool.check()  # the fakes go silent: the real sampler still sends, the run goes on
    assert pool.alive() == ["real"] and pool.none_left() is None
    for i in range(3000, 3010):  # live fakes again, and the real sampler stops
        pool.heard(f"fake-{i}", beat(GENERATING, i))
    pool.stopped("real", "done", "r")
    assert pool.none_left() == "no sampler left: sampler real stopped: done"
    # A few dozen lines for thousands of joins and drops, not one each.
    assert len(caplog.records) < 100, len(caplog.records)


def test_a_stop_is_taken_only_from_the_process_heard_under_its_id():
    """Issue 62, item 4: a stop forged in a lone sampler's name (its id is no secret: batches
    and the trainer's heartbeats carry it) ended the run. A stop carries the incarnation the
    sampler's heartbeats do; one naming none, or another, is not taken: the other waits for a
    heartbeat of that incarnation, which a sampler that stops at once sends by another socket
    (either may arrive first)."""
    pool, _ = make_pool()
    pool.heard("s0", beat(GENERATING, 1, "real"))
    for forged in (None, "guess", ["real"]):
        pool.stopped("s0", "forged", forged)
    pool.stopped("x-1", "forged", "x")  # a made-up id's stop: nothing of it in the pool
    assert pool.alive() == ["s0"] and pool.none_left() is None and pool.refused == 2
    assert pool.is_from("s0", "real") and not pool.is_from("s0", "guess")
    pool.stopped("s0", "interrupted", "real")
    assert pool.none_left() == "no sampler left: sampler s0 stopped: interrupted"
    pool.heard("s0", {"incarnation": ["real"]})  # no incarnation, so no restart: still stopped
    assert pool.none_left() is not None and pool.members["s0"].incarnation == "real"
    early, _ = make_pool()
    early.stopped("s1", "config mismatch", "first")  # its stop before its first heartbeat
    assert early.members == {} and early.none_left() is None
    early.heard("s1", beat(WAITING, 0, "first"))
    assert early.none_left() == "no sampler left: sampler s1 stopped: config mismatch"
    for i in range(1000):  # stops waiting for heartbeats that never come: a bounded table
        early.stopped(f"x-{i}", "forged", "x")
    assert len(early.stops_waiting) <= 64
    batch_first, _ = make_pool()  # vouched by a batch before any heartbeat: no incarnation
    batch_first.vouch("s2")  # yet, so a stop naming none is no more its than any other
    batch_first.stopped("s2", "forged", None)
    assert batch_first.alive() == ["s2"] and batch_first.none_left() is None


def told_relays(pool: SamplerPool) -> dict[str, str]:
    """The relays the stream mode's trainer end announces from `pool` (its real announced)."""
    end = MemoryServer.__new__(MemoryServer)
    end.store = SimpleNamespace(identities=dict)  # type: ignore[assignment]
    end.link = SimpleNamespace(published=0, members=lambda: pool.vouched, failed=lambda why: None)
    return end.announced()["relays"]


def test_the_vouched_snapshot_follows_each_sampler_s_body_and_drop():
    """What the weights mode's trainer end reads (the broadcaster's group, the relays), rebuilt
    whenever a sampler's incarnation, weights body or liveness moves, and only then; a body
    that is no bounded dict of strings is not taken."""
    clock = [0.0]
    pool = SamplerPool(peer_timeout_s=10, stall_timeout_s=10, clock=lambda: clock[0],
                       trusted={"s0"})  # fmt: skip

    def beat(sid: str, incarnation: str, weights: object) -> None:
        pool.heard(sid, {"incarnation": incarnation, "weights": weights})

    beat("s0", "i", {"collective": "ready:0"})
    beat("ghost", "g", {"collective": "ready:0"})  # never vouched for
    assert pool.vouched == {"s0": Vouched("i", {"collective": "ready:0"}, False)}
    snapshot = pool.vouched
    beat("s0", "i", {"collective": "ready:0"})
    assert pool.vouched is snapshot  # nothing moved: not rebuilt
    beat("s0", "i", {"collective": "member:1"})
    assert pool.vouched["s0"].body == {"collective": "member:1"}
    for forged in (
        {"collective": 7},
        {"k" * 33: "v"},
        {"v": "x" * 257},
        [1],
        {str(i): "" for i in range(9)},
    ):
        beat("s0", "i", forged)
        assert pool.vouched["s0"].body == {"collective": "member:1"}, forged
    beat("s0", "j", {"collective": "ready:0"})  # restarted
    assert pool.vouched["s0"] == Vouched("j", {"collective": "ready:0"}, False)
    clock[0] = 11.0
    pool.check()  # silent past the timeout: dropped, and out of the snapshot
    assert pool.vouched == {}
    beat("s0", "j", {"collective": "ready:0"})  # back
    assert list(pool.vouched) == ["s0"]


def test_a_sampler_heard_of_counts_only_once_vouched_for():
    """Heartbeats under made-up ids are tracked (liveness, the startup check) but count nowhere
    the samplers act on: not in the number alive they pace by, not as relays, not in the
    collective group. A sampler counts once a batch of its own is admitted (vouch), at once when
    a resumed trainer's ledger names it, and every id under CURVE."""
    pool = SamplerPool(peer_timeout_s=10, stall_timeout_s=10, trusted={"resumed"},
                       relay_ids=frozenset({"real", "resumed"}))  # fmt: skip
    relay = "tcp://10.0.0.9:5"
    beat = {"incarnation": "i", "weights": {"relay": relay, "collective": "ready:0"}}
    for sid in ("real", "resumed", *(f"ghost-{i}" for i in range(40))):
        pool.heard(sid, beat)
    assert len(pool.alive()) == 42 and pool.counted() == ["resumed"]
    assert told_relays(pool) == {"resumed": relay} and list(pool.vouched) == ["resumed"]
    pool.vouch("real")  # its first batch admitted
    assert pool.counted() == ["real", "resumed"] and set(pool.vouched) == {"real", "resumed"}
    curve = SamplerPool(peer_timeout_s=10, stall_timeout_s=10, authenticated=True)
    curve.heard("keyed", beat)
    assert curve.counted() == ["keyed"] and told_relays(curve) == {"keyed": relay}


def test_without_curve_only_the_listed_samplers_relay():
    """Issue 62, item 3: without CURVE one batch anyone sends vouches for its id, and a vouched
    id's relay became sampler-0's first source. Now a relay is told only for the ids of
    transport.relay_samplers (none by default), and under CURVE for any authorised sampler;
    the trainer's endpoint builds its pool so (the wiring, through the real object)."""
    beat = {"incarnation": "i", "weights": {"relay": "tcp://10.0.0.9:5"}}
    for listed, told in (
        (frozenset(), {}),
        (frozenset({"sampler-1"}), {"sampler-1": "tcp://10.0.0.9:5"}),
    ):
        pool = SamplerPool(peer_timeout_s=10, stall_timeout_s=10, relay_ids=listed)
        for sid in ("sampler-1", "0x"):  # "0x" sorts first: the forger's pick
            pool.heard(sid, beat)
            pool.vouch(sid)
        assert pool.counted() == ["0x", "sampler-1"] and told_relays(pool) == told
    from tests.test_transport import _cfg, trainer_endpoint

    trainer = trainer_endpoint(_cfg(relay_samplers=["sampler-1"]))
    try:
        assert trainer.pool.relay_ids == {"sampler-1"} and not trainer.pool.authenticated
    finally:
        trainer.close()
