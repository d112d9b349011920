"""Exactly-once delivery and resume, piece by piece: the ledger, the sampler's spool, resumable
question streams, version checksums, and acknowledgements over real sockets."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.core.resume import require_same
from grpo.core.seqset import SeqSet
from grpo.delivery.ledger import Ledger, overtaken
from grpo.delivery.spool import Spool
from grpo.sampler.data import question_order
from grpo.trainer.state import truncate_metrics
from grpo.weights.dirs import (
    VERSION_MARKER,
    discard_versions_after,
    publish_version,
    verify_version,
    version_dir,
)
from grpo.weights.modes.shared_dir import DirReceiver
from grpo.wire.blobs import frames_to_bytes
from grpo.wire.codec import FrameError, encode_batch
from tests.test_episode import assert_batches_identical, make_batch
from tests.test_transport import _batch, _cfg, sampler_endpoint, trainer_endpoint

# --------------------------------------------------------------------------- ledger


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=80))
def test_seqset_is_a_set_of_ints(seqs: list[int]) -> None:
    s = SeqSet()
    for q in seqs:
        s.add(q)
    assert len(s) == len(set(seqs))
    assert all((q in s) == (q in seqs) for q in range(70))
    assert all(q > s.low + 1 for q in s.extra)  # compact: no member sits next to `low`
    again = SeqSet.from_json(json.loads(json.dumps(s.to_json())))
    assert (again.low, again.extra) == (s.low, s.extra)


@pytest.mark.parametrize(
    "bad",
    [None, [], {"low": "1", "extra": []}, {"low": -2, "extra": []}, {"low": 3, "extra": [4]},
     {"low": 0, "extra": [5.0]}, {"low": 0}],
)  # fmt: skip
def test_seqset_from_json_rejects_malformed_acks(bad) -> None:
    with pytest.raises(ValueError, match="not a sequence set"):
        SeqSet.from_json(bad)


def test_overtaken_batches_are_the_lost_ones() -> None:
    consumed = SeqSet(low=2, extra={5})
    assert consumed.highest() == 5 and SeqSet().highest() == -1
    # 3 and 4 were passed over (5 was trained); 6 and 7 may still be on their way.
    assert overtaken([3, 4, 6, 7], consumed) == [3, 4]
    assert overtaken([0, 1], SeqSet()) == []


def test_ledger_acknowledges_only_what_is_durable() -> None:
    ledger = Ledger()
    ledger.consume("a", 0)
    ledger.consume("a", 1)
    assert ledger.is_duplicate("a", 1) and not ledger.is_duplicate("b", 1)
    assert ledger.acks() == {}  # trained, not yet saved
    ledger.mark_durable()
    ledger.consume("a", 2)
    assert ledger.acks() == {"a": {"low": 1, "extra": []}}
    resumed = Ledger.from_acks(ledger.acks())  # what a restarted trainer knows
    assert resumed.is_duplicate("a", 1) and not resumed.is_duplicate("a", 2)


# --------------------------------------------------------------------------- spool


def test_spool_keeps_batches_until_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_batches=3)
    batches = [make_batch(seed=i) for i in range(3)]
    for seq, b in enumerate(batches):
        spool.put(seq, encode_batch(b))
    assert spool.pending() == [0, 1, 2] and spool.full()
    assert_batches_identical(spool.batch(1), batches[1])
    assert spool.acknowledge(SeqSet(low=0, extra={2})) == 2
    assert spool.pending() == [1] and not spool.full()
    spool.write_state({"next_seq": 3})
    assert Spool(tmp_path / "s", 3).read_state() == {"next_seq": 3}
    spool.clear()
    assert spool.pending() == [] and spool.read_state() is None


def test_spool_drops_interrupted_writes_and_refuses_corrupt_batches(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_batches=4)
    spool.put(0, encode_batch(make_batch(seed=0)))
    (tmp_path / ".b000000001.frames.tmp").write_bytes(b"half a batch")
    frames = [bytearray(f) for f in spool.frames(0)]
    frames[1][0] ^= 0xFF  # a flipped token id on disk
    (tmp_path / "b000000000.frames").write_bytes(frames_to_bytes(frames))
    spool = Spool(tmp_path, max_batches=4)
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(FrameError, match="checksum"):
        spool.batch(0)


# --------------------------------------------------------------------------- dataset position


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(0, 40), st.booleans())
def test_question_order_resumes_where_it_stopped(rows: int, n: int, start: int, shuffle: bool):
    whole = question_order(rows, seed=7, shuffle=shuffle)
    flat = [next(whole) for _ in range(start + 3 * n)]
    resumed = question_order(rows, seed=7, shuffle=shuffle, start=start)
    assert [next(resumed) for _ in range(3 * n)] == flat[start:]


# --------------------------------------------------------------------------- checkpoints


def _publish(run_dir: Path, version: int) -> Path:
    def save(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(bytes(range(256)) * 64)

    return publish_version(run_dir, version, save, keep=5, step=version)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_version_s_files_take_the_user_s_umask(tmp_path, umask):
    """Issue 64, item 6: a version's weights were written as their writer made them, 0600
    (transformers writes through a private temporary file): unreadable to a sampler of another
    user. Two umasks, so that neither a default nor the test's own setting grants it."""

    def save(tmp: Path) -> None:
        path = tmp / "model.safetensors"
        path.write_bytes(b"w" * 64)
        path.chmod(0o600)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "part.bin").write_bytes(b"p")
        (tmp / "sub" / "part.bin").chmod(0o600)

    old = os.umask(umask)
    try:
        vdir = publish_version(tmp_path, 1, save, keep=5, step=1)
    finally:
        os.umask(old)
    modes = {p.relative_to(vdir).as_posix(): p.stat().st_mode & 0o777
             for p in vdir.rglob("*") if p.is_file()}  # fmt: skip
    assert set(modes) == {"model.safetensors", "sub/part.bin", VERSION_MARKER}, modes
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_version_is_on_the_disk_before_latest_names_it(tmp_path, monkeypatch):
    """finding 9 (versions): every file of the version, its dir and its rename into versions/
    are fsynced before LATEST is replaced; else a power loss could leave LATEST naming
    weights that were never written."""
    import os

    events: list[tuple[str, str]] = []
    real_fsync, real_open, real_replace = os.fsync, os.open, os.replace
    opened: dict[int, str] = {}

    def open_(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = str(path)
        return fd

    def fsync(fd: int) -> None:
        events.append(("fsync", opened.get(fd) or os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    final = _publish(tmp_path, 3)
    latest = events.index(("replace", str(tmp_path / "LATEST")))
    synced = {path for kind, path in events[:latest] if kind == "fsync"}
    tmp = final.with_name(f".{final.name}.tmp")
    wanted = {str(tmp / p.name) for p in final.iterdir()} | {str(tmp), str(final.parent)}
    assert wanted <= synced, f"not fsynced before LATEST: {sorted(wanted - synced)}"
    assert (tmp_path / "LATEST").read_text() == "3\n"


def test_verify_version_catches_corrupt_truncated_and_unfinished_dirs(tmp_path: Path) -> None:
    vdir = _publish(tmp_path, 1)
    verify_version(vdir)
    weights = vdir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        verify_version(vdir)
    weights.write_bytes(bytes(data[:-10]))
    with pytest.raises(ValueError, match="corrupt"):
        verify_version(vdir)
    (vdir / "version.json").unlink()
    with pytest.raises(ValueError, match="missing or incomplete"):
        verify_version(vdir)
    with pytest.raises(ValueError, match="missing or incomplete"):
        verify_version(version_dir(tmp_path, 9))


def test_discard_versions_after_a_resume_point(tmp_path: Path) -> None:
    for v in (1, 2, 3, 4):
        _publish(tmp_path, v)
    assert discard_versions_after(tmp_path, 2) == [3, 4]
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == ["v000001", "v000002"]


def test_require_same_names_the_key() -> None:
    require_same({"world": 2, "x": 1}, {"world": 2}, "it", "fix it")
    with pytest.raises(ValueError, match=r"saved with world=2, this run has world=1; fix it"):
        require_same({"world": 2}, {"world": 1}, "it", "fix it")


def test_truncate_metrics_drops_rows_of_undone_steps(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)) + '{"st')
    assert truncate_metrics(path, 2) == 2
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(0, 6), max_size=30).map(sorted), resume=st.integers(0, 6),
       pads=st.lists(st.integers(0, 40), min_size=30, max_size=30), torn=st.booleans(),
       block=st.integers(1, 64))  # fmt: skip
def test_truncate_metrics_reads_only_the_tail_and_cuts_where_a_whole_read_would(
    tmp_path_factory, steps, resume, pads, torn, block
) -> None:
    """Issue 62 (low): samples.jsonl was read whole on resume. The file is now read back from
    its end, a block at a time, and cut after the last row at or before the resumed step:
    the rows kept are those a whole read keeps, whatever the lengths and block size."""
    from grpo.trainer import state

    path = tmp_path_factory.mktemp("rows") / "samples.jsonl"
    rows = [json.dumps({"step": s, "answer": "x" * p}) for s, p in zip(steps, pads, strict=False)]
    path.write_text("".join(r + "\n" for r in rows) + ('{"step": 9, "ans' if torn else ""))
    read: list[int] = []
    real_read = state._lines_from_the_end

    def counted(f, end):
        for at, line in real_read(f, end):
            read.append(len(line))
            yield at, line

    kept = [s for s in steps if s <= resume]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(state, "TAIL_BLOCK", block)
        patch.setattr(state, "_lines_from_the_end", counted)
        assert truncate_metrics(path, resume) == len(steps) - len(kept)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == kept
    assert len(read) <= len(steps) - len(kept) + 1 + torn  # the tail, not the file


# --------------------------------------------------------------------------- acknowledgements


def _wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_acks_reach_the_sampler_and_a_trainer_restart_is_noticed(tmp_path: Path) -> None:
    """What the trainer's endpoint reports, from its ledger, in every heartbeat: the batches
    saved (acks) and trained (consumed); a resumed trainer's older ones replace them."""
    cfg = _cfg(peer_timeout_s=10, startup_timeout_s=10)
    ledger = Ledger()
    trainer = trainer_endpoint(cfg, ledger, version=5)
    sampler = sampler_endpoint(cfg, tmp_path)
    try:
        assert _wait(lambda: sampler.status.version == 5)
        for seq in range(4):
            ledger.consume("s0", seq)
        ledger.consume("other", 0)
        ledger.mark_durable()
        trainer.saved()  # acknowledged by this alone: nothing else is reported before the wait
        assert _wait(lambda: 3 in sampler.status.acked)
        ledger.consume("s0", 6)
        trainer.consumed()
        assert _wait(lambda: 6 in sampler.status.consumed)
        assert 4 not in sampler.status.acked and 6 not in sampler.status.acked
        assert sampler.status.trained == {"s0": 5, "other": 1} and sampler.status.restarts == 0
        trainer.published(6)
        assert _wait(lambda: sampler.status.version == 6)
        trainer.close()
        # Resumed from an older state: version 2, fewer acknowledgements. The sampler follows.
        resumed = Ledger({"s0": SeqSet(low=1)})
        trainer = trainer_endpoint(cfg, resumed, version=2)
        assert _wait(lambda: sampler.status.restarts == 1)
        assert sampler.status.version == 2
        # What the old trainer said it trained (up to 6) is forgotten: the new one has only 0, 1.
        assert _wait(lambda: sampler.status.consumed.highest() == 1)
        assert 1 in sampler.status.acked and 2 not in sampler.status.acked
    finally:
        sampler.close()
        trainer.close()


def _wait_on(sampler, cond, timeout: float = 5.0) -> bool:
    """Wait as the sampler's loop does (keeping the spool in step), at most `timeout`."""
    deadline = time.monotonic() + timeout
    sampler.wait_until(lambda: cond() or time.monotonic() > deadline, "the test")
    return cond()


def test_the_spool_follows_the_acks_and_is_resent_to_a_restarted_trainer(tmp_path: Path):
    """The sampler's endpoint keeps each batch it sends until the trainer saved it; a resumed
    trainer is sent again what its saved state does not hold."""
    cfg = _cfg(peer_timeout_s=10, startup_timeout_s=10)
    ledger = Ledger()
    trainer = trainer_endpoint(cfg, ledger)
    sampler = sampler_endpoint(cfg, tmp_path, sampler_id="sampler-0")
    try:
        sampler.wait_for_trainer()
        for seq in range(3):
            sampler.send(_batch(seq), {"next_seq": seq + 1})
            batch = trainer.receive_batch(wait_s=5)
            assert batch is not None and batch.seq == seq
            ledger.consume("sampler-0", seq)
            trainer.consumed()
            if seq == 1:
                ledger.mark_durable()
                trainer.saved()
        assert sampler.spool.read_state() == {"next_seq": 3}
        assert _wait_on(sampler, lambda: sampler.spool.pending() == [2])  # 0, 1 saved
        trainer.close()
        trainer = trainer_endpoint(cfg, Ledger.from_acks(ledger.acks()))  # resumed: 0 and 1
        assert _wait_on(sampler, lambda: sampler.status.restarts == 1)
        sampler.wait_for_room()  # as before its next batch: the restart is handled
        batch = trainer.receive_batch(wait_s=5)
        assert batch is not None and batch.seq == 2
    finally:
        sampler.close()
        trainer.close()


def test_sampler_keeps_its_weights_when_a_version_is_corrupt(tmp_path, tiny_model_dir, caplog):
    import torch

    from grpo.config import load_config
    from grpo.sampler.loop import Sampler
    from tests.test_integration import tiny_config

    sampler = Sampler(load_config(tiny_config(tmp_path, tiny_model_dir)))
    policy = sampler.policy.module()
    before = {k: v.clone() for k, v in policy.state_dict().items()}

    def save_shifted(tmp: Path) -> None:
        shifted = {k: v + 0.5 for k, v in before.items()}
        policy.save_pretrained(tmp, state_dict=shifted, save_original_format=False)

    for v in (1, 2):
        publish_version(sampler.run_dir, v, save_shifted, keep=5, step=v)
    weights = version_dir(sampler.run_dir, 1) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x40  # a flipped bit in some weight
    weights.write_bytes(bytes(data))

    sampler.weights.receiver = DirReceiver(sampler.run_dir)  # weights.mode shared_dir
    sampler.weights.reload(1)
    assert sampler.weights.version == 0 and 1 in sampler.weights.failed_reloads
    assert "keeping version 0, not loading version 1" in caplog.text and "corrupt" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    sampler.weights.reload(2)
    assert sampler.weights.version == 2
    assert torch.allclose(
        policy.state_dict()["model.norm.weight"], before["model.norm.weight"] + 0.5
    )


def test_a_sharded_version_is_published_verified_and_reloaded(tmp_path, tiny_model_dir):
    """A model larger than train.max_shard_size is saved as several files and an index
    (save_pretrained): every shard is checksummed, and the sampler reloads all of them."""
    import torch

    from grpo.config import load_config
    from grpo.sampler.loop import Sampler
    from grpo.weights.dirs import SHARD_INDEX, load_state_dict, weight_files
    from tests.test_integration import tiny_config

    sampler = Sampler(load_config(tiny_config(tmp_path, tiny_model_dir)))
    policy = sampler.policy.module()
    shifted = {k: v + 0.25 for k, v in policy.state_dict().items()}

    def save_sharded(tmp: Path) -> None:  # a copy: save_pretrained empties the dict it is given
        policy.save_pretrained(
            tmp, state_dict=dict(shifted), save_original_format=False, max_shard_size="2MB"
        )

    vdir = publish_version(sampler.run_dir, 1, save_sharded, keep=5, step=1)
    shards = weight_files(vdir)
    assert len(shards) >= 3 and (vdir / SHARD_INDEX).is_file()
    assert not (vdir / "model.safetensors").exists()
    manifest = json.loads((vdir / "version.json").read_text())["files"]
    assert {p.name for p in shards} | {SHARD_INDEX} <= set(manifest)
    assert all(torch.equal(shifted[k], v) for k, v in load_state_dict(vdir).items())
    sampler.weights.receiver = DirReceiver(sampler.run_dir)  # weights.mode shared_dir
    sampler.weights.reload(1)
    assert sampler.weights.version == 1
    assert all(torch.equal(shifted[k], v) for k, v in policy.state_dict().items())

    last = shards[-1]  # one damaged shard: not loaded, the weights stay
    last.write_bytes(last.read_bytes()[:-8])
    with pytest.raises(ValueError, match="corrupt"):
        verify_version(vdir)
    index = json.loads((vdir / SHARD_INDEX).read_text())
    index["weight_map"]["x"] = "../elsewhere.safetensors"
    (vdir / SHARD_INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="names shards that are not in"):
        weight_files(vdir)


def _numbered(seq: int, sampler_id: str):
    from grpo.core.episode import EpisodeBatch

    b = make_batch()
    return EpisodeBatch(b.episodes, b.group_size, policy_version=0, seq=seq, sampler_id=sampler_id)


def test_batches_are_trained_in_each_samplers_seq_order() -> None:
    """After a restart batch 3 (queued before the crash) can arrive before the resent 2: it is
    held, reported as received (so 2 is resent if lost), and trained after 2."""
    from grpo.delivery.ordering import InOrder

    ledger = Ledger()
    order = InOrder(ledger, max_held=3, patience_s=60)
    for seq in (0, 1):
        ledger.consume("s0", seq)
    for seq in (3, 4):
        order.hold(_numbered(seq=seq, sampler_id="s0"))
    order.hold(_numbered(seq=0, sampler_id="s1"))  # another sampler's first: ready at once
    assert order.pop_ready().sampler_id == "s1"
    assert order.pop_ready() is None  # s0 waits for 2
    received = SeqSet.from_json(order.received_json()["s0"])
    assert overtaken([2, 3, 4], received) == [2]  # what the sampler will resend
    order.hold(_numbered(seq=2, sampler_id="s0"))
    trained = []
    while (batch := order.pop_ready()) is not None:
        trained.append(batch.seq)
        ledger.consume("s0", batch.seq)
    assert trained == [2, 3, 4] and not order.held


def test_a_batch_that_never_comes_does_not_stop_the_run(caplog) -> None:
    from grpo.delivery.ordering import InOrder

    ledger = Ledger()
    too_many = InOrder(ledger, max_held=2, patience_s=60)
    for seq in (1, 2, 3):  # 0 never comes; more held than a spool holds
        too_many.hold(_numbered(seq=seq, sampler_id="s0"))
    assert too_many.pop_ready().seq == 1
    assert "training batch 1 from s0 out of order: batches 0 to 0 never came" in caplog.text
    # A seq of 2**40 is one short line, not a list of a trillion numbers (issue 62, finding 5).
    huge = InOrder(Ledger(), max_held=0, patience_s=60)
    huge.hold(_numbered(seq=2**40, sampler_id="s1"))
    assert huge.pop_ready().seq == 2**40
    assert f"batches 0 to {2**40 - 1} never came" in caplog.text and len(caplog.text) < 2000
    too_long = InOrder(Ledger(), max_held=10, patience_s=0.0)
    too_long.hold(_numbered(seq=5, sampler_id="s0"))
    time.sleep(0.01)
    assert too_long.pop_ready().seq == 5


def test_a_seq_no_sampler_can_hold_unacknowledged_is_refused_before_it_is_held() -> None:
    """Issue 62, finding 5: a seq of 2**40 (or 3e7) was held, then trained out of order; its
    gap once filled memory. A sampler's spool holds at most spool_max_batches (here 4) batches
    unacknowledged, all from the first not trained, so any seq further ahead is refused: counted
    over the seqs not yet trained, as batches trained out of order free spool slots."""
    from grpo.delivery.ordering import InOrder

    ledger = Ledger()
    order = InOrder(ledger, max_held=4, patience_s=60)
    for seq in (0, 1):
        ledger.consume("s0", seq)
    assert order.too_far(_numbered(seq=5, sampler_id="s0")) is None  # 2, 3, 4, 5: four
    why = order.too_far(_numbered(seq=6, sampler_id="s0"))
    assert why == (
        "its seq 6 is further ahead of the first batch of s0 not yet trained (2) than the 4 a "
        "sampler holds unacknowledged: start both roles with the same rollout.spool_max_batches"
    )
    assert order.too_far(_numbered(seq=2**40, sampler_id="s0")) is not None
    for seq in (4, 5):  # trained while 2 and 3 were lost: their slots are free again
        ledger.consume("s0", seq)
    assert order.too_far(_numbered(seq=7, sampler_id="s0")) is None  # 2, 3, 6, 7
    assert order.too_far(_numbered(seq=8, sampler_id="s0")) is not None
    assert order.too_far(_numbered(seq=3, sampler_id="new")) is None  # 0 to 3 of another one
