"""grpo.core.episode and grpo.wire.codec: batch validation and the pickle-free wire codec."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import math
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo.core.episode import Episode, EpisodeBatch
from grpo.wire.blobs import bytes_to_frames, frames_to_bytes
from grpo.wire.codec import (
    MAGIC,
    SCHEMA_VERSION,
    FrameError,
    Message,
    UncheckedFrameError,
    decode,
    encode_batch,
    encode_message,
    seal,
)

# --------------------------------------------------------------------------- helpers


def make_episode(
    rng: np.random.Generator, group_id: int, completion_len: int, rollout: bool, mask: bool = False,
    versions: bool = False,
) -> Episode:  # fmt: skip
    c = completion_len
    episode = Episode(
        prompt_ids=rng.integers(0, 50_000, size=int(rng.integers(1, 20)), dtype=np.int32),
        completion_ids=rng.integers(0, 50_000, size=c, dtype=np.int32),
        old_logp=-rng.random(c, dtype=np.float32),
        ref_logp=-rng.random(c, dtype=np.float32),
        reward=float(rng.normal()),
        reward_info={"correct": bool(rng.integers(2)), "parsed": "42", "n": 3, "x": None},
        finish_reason="stop" if rng.integers(2) else "length",
        group_id=group_id,
        rollout_logp=-rng.random(c, dtype=np.float32) if rollout else None,
        loss_mask=rng.integers(0, 2, size=c, dtype=np.uint8) if mask else None,
    )
    if not versions:  # drawn last: the other batches are what they were without versions
        return episode
    # Continuous generation: the batch's policy_version (5) or newer, rising along the answer.
    steps = np.cumsum(rng.random(c) < 0.3).astype(np.int32)
    return dataclasses.replace(episode, token_versions=5 + steps)


def make_batch(
    seed: int = 0, num_groups: int = 3, group_size: int = 4, rollout: bool = True,
    mask: bool = False, versions: bool = False,
) -> EpisodeBatch:  # fmt: skip
    rng = np.random.default_rng(seed)
    eps = []
    for g in range(num_groups):
        gid = 100 + 7 * g
        for _ in range(group_size):
            # Zero-length completions are legal and exercise empty slices.
            c = int(rng.integers(0, 12)) if rng.random() > 0.2 else 0
            eps.append(make_episode(rng, gid, c, rollout, mask, versions))
    return EpisodeBatch(
        episodes=tuple(eps),
        group_size=group_size,
        policy_version=5,
        seq=17,
        sampler_id="sampler-3",
        stats={"gen_s": 1.25, "tokens": 1234.0},
    )


def received(frames: list[Any]) -> list[bytes]:
    """What a receiver gets: independent byte copies of each frame."""
    return [bytes(f) for f in frames]


def packed_header(frames: list[Any]) -> bytes:
    """Frame 0 without its 8-byte checksum: the msgpack header, to change and seal again."""
    return bytes(frames[0])[8:]


def header_of(frames: list[Any]) -> dict[str, Any]:
    return msgpack.unpackb(packed_header(frames), raw=False)


def with_header(frames: list[Any], **changes: Any) -> list[bytes]:
    """Frames with header fields replaced (a value of ``...`` deletes the field)."""
    h = header_of(frames)
    for k, v in changes.items():
        if v is ...:
            del h[k]
        else:
            h[k] = v
    return seal(msgpack.packb(h, use_bin_type=True), received(frames[1:]))


def assert_episodes_identical(a: Episode, b: Episode) -> None:
    for name in ("prompt_ids", "completion_ids", "old_logp", "ref_logp"):
        x, y = getattr(a, name), getattr(b, name)
        assert y.dtype == (np.int32 if "ids" in name else np.float32)
        assert x.tobytes() == y.tobytes()  # bit-identical
    for name in ("rollout_logp", "loss_mask", "token_versions"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.tobytes() == y.tobytes()
    assert a.reward == b.reward
    assert a.reward_info == b.reward_info
    assert a.finish_reason == b.finish_reason
    assert a.group_id == b.group_id


def assert_batches_identical(a: EpisodeBatch, b: EpisodeBatch) -> None:
    assert (a.group_size, a.policy_version, a.seq, a.sampler_id, a.stats) == (
        b.group_size,
        b.policy_version,
        b.seq,
        b.sampler_id,
        b.stats,
    )
    assert len(a.episodes) == len(b.episodes)
    for x, y in zip(a.episodes, b.episodes, strict=True):
        assert_episodes_identical(x, y)


GOOD_FRAMES = received(encode_batch(make_batch(seed=1, num_groups=2, group_size=2)))
GOOD_MESSAGE = encode_message(Message("heartbeat", {"t": 1.5, "step": 3}))


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("rollout", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip(rollout: bool, seed: int) -> None:
    batch = make_batch(seed=seed, rollout=rollout)
    frames = encode_batch(batch)
    assert len(frames) == (6 if rollout else 5)
    out = decode(received(frames))
    assert isinstance(out, EpisodeBatch)
    assert_batches_identical(batch, out)


@pytest.mark.parametrize("rollout", [True, False])
def test_round_trip_with_a_loss_mask(rollout: bool) -> None:
    """A multi-turn batch: the per-token loss mask is one more array frame, uint8."""
    batch = make_batch(seed=4, rollout=rollout, mask=True)
    frames = encode_batch(batch)
    assert len(frames) == (7 if rollout else 6)
    assert header_of(frames)["arrays"][-1] == {
        "name": "loss_mask", "dtype": "uint8", "count": len(batch.columns.completion_ids),
    }  # fmt: skip
    out = decode(received(frames))
    assert_batches_identical(batch, out)
    assert out.columns.loss_mask.dtype == np.uint8
    sub = out.select_groups(1, 2)  # slices of the mask travel with their episodes
    assert_episodes_identical(batch.episodes[4], sub.episodes[0])


def test_a_single_turn_batch_encodes_to_the_bytes_it_did_before_the_loss_mask() -> None:
    """No mask, no trace of one: these frames' digest was taken with the codec as it was before
    the loss mask existed (commit 2da8e76), so single-turn runs send exactly what they sent."""
    eps = []
    for k in range(4):
        c = np.arange(k + 1, dtype=np.int32) + 10 * k
        lp = -np.linspace(0.25, 1.0, k + 1).astype(np.float32)
        eps.append(Episode(np.arange(3, dtype=np.int32) + k, c, lp, lp * 2, 0.5 * k,
                           {"correct": k == 1, "pred": str(k)}, ("stop", "length")[k % 2],
                           7 + k // 2, lp * 3))  # fmt: skip
    frames = encode_batch(EpisodeBatch(eps, 2, 3, 11, "sampler-0", {"gen_s": 1.5}))
    digest = hashlib.sha256(b"".join(bytes(f) for f in frames)).hexdigest()
    assert len(frames) == 6
    assert digest == "0b13ca7a9ac6e8dd1bd815790c4786b73448716a5129e7218d7cc6d5eee8f329"


def test_a_loss_mask_on_some_episodes_is_all_ones_on_the_others() -> None:
    """Dropping the batch's mask, as a partial rollout_logp is dropped, would train on a tool's
    tokens: the episodes without one are all the model's."""
    batch = make_batch(seed=5, num_groups=1, group_size=2, mask=True)
    first, second = batch.episodes
    bools = _replace(first, loss_mask=first.loss_mask.astype(bool))  # bool masks are accepted
    out = decode(received(encode_batch(EpisodeBatch([bools, _replace(second, loss_mask=None)],
                                                    2, 0, 0))))  # fmt: skip
    got_first, got_second = out.episodes
    assert np.array_equal(got_first.loss_mask, first.loss_mask)
    assert (got_second.loss_mask == 1).all() and len(got_second.loss_mask) == len(
        second.completion_ids
    )


def test_round_trip_all_empty_completions() -> None:
    rng = np.random.default_rng(0)
    eps = tuple(make_episode(rng, 0, 0, True) for _ in range(2))
    batch = EpisodeBatch(episodes=eps, group_size=2, policy_version=0, seq=0)
    out = decode(received(encode_batch(batch)))
    assert_batches_identical(batch, out)
    assert all(ep.completion_ids.shape == (0,) for ep in out.episodes)


def test_decode_accepts_memoryviews_directly() -> None:
    batch = make_batch()
    assert_batches_identical(batch, decode(encode_batch(batch)))


def test_decode_accepts_zmq_frames() -> None:
    batch = make_batch()
    frames = [zmq.Frame(f) for f in received(encode_batch(batch))]
    assert_batches_identical(batch, decode(frames))


def test_decode_returns_views_not_copies() -> None:
    frames = received(encode_batch(make_batch()))
    out = decode(frames)
    buffers = [np.frombuffer(f, dtype=np.uint8) for f in frames]
    names = ("prompt_ids", "completion_ids", "old_logp", "ref_logp", "rollout_logp")
    viewed = dict.fromkeys(names, 0)
    for ep in out.episodes:
        for i, name in enumerate(names, start=1):
            arr = getattr(ep, name)
            if arr.size:  # an empty answer's arrays share no bytes to check
                assert np.shares_memory(arr, buffers[i]), name
                viewed[name] += 1
            assert not arr.flags.writeable  # views of immutable bytes
    assert min(viewed.values()) >= len(out.episodes) // 2, viewed  # most were checked


def test_partial_rollout_logp_is_dropped() -> None:
    batch = make_batch(rollout=True)
    eps = list(batch.episodes)
    e = eps[0]
    eps[0] = Episode(
        e.prompt_ids,
        e.completion_ids,
        e.old_logp,
        e.ref_logp,
        e.reward,
        e.reward_info,
        e.finish_reason,
        e.group_id,
    )
    mixed = EpisodeBatch(tuple(eps), batch.group_size, batch.policy_version, batch.seq)
    frames = encode_batch(mixed)
    assert len(frames) == 5
    out = decode(received(frames))
    assert all(ep.rollout_logp is None for ep in out.episodes)


def test_batch_without_old_and_ref_logprobs_round_trips_and_takes_them_later() -> None:
    """train.logprobs_on: trainer: the sampler sends neither; the trainer fills them in."""
    batch = make_batch(rollout=True)
    bare = [
        Episode(e.prompt_ids, e.completion_ids, None, None, e.reward, e.reward_info,
                e.finish_reason, e.group_id, e.rollout_logp)
        for e in batch.episodes
    ]  # fmt: skip
    frames = encode_batch(EpisodeBatch(bare, batch.group_size, 0, 0))
    assert len(frames) == 4  # header, prompt ids, completion ids, rollout log-probs
    out = decode(received(frames))
    assert all(e.old_logp is None and e.ref_logp is None for e in out.episodes)
    old = [np.full(len(e.completion_ids), -1.5) for e in out.episodes]
    filled = out.with_arrays(old_logp=old, ref_logp=old)
    for e in filled.episodes:
        assert e.old_logp.dtype == np.float32 and (e.old_logp == -1.5).all()
        assert e.rollout_logp is not None and e.ref_logp is not None
    again = decode(received(encode_batch(filled)))
    assert np.array_equal(again.columns.old_logp, filled.columns.old_logp)
    with pytest.raises(ValueError, match="not"):
        out.with_arrays(prompt_ids=old)
    with pytest.raises(ValueError, match="arrays for"):
        out.with_arrays(old_logp=old[:-1])


def test_encode_casts_to_wire_dtypes() -> None:
    ep = Episode(
        prompt_ids=np.arange(5, dtype=np.int64),
        completion_ids=np.arange(3, dtype=np.int64),
        old_logp=np.array([-0.5, -1.0, -2.0]),
        ref_logp=np.array([-0.25, -1.0, -2.0]),
        reward=np.float32(1.0),
        reward_info={"score": np.float64(0.5), "count": np.int64(2)},
        finish_reason="stop",
        group_id=3,
    )
    out = decode(received(encode_batch(EpisodeBatch((ep,), 1, 0, 0))))
    got = out.episodes[0]
    assert got.prompt_ids.dtype == np.int32 and got.old_logp.dtype == np.float32
    np.testing.assert_array_equal(got.completion_ids, [0, 1, 2])
    assert got.reward_info == {"score": 0.5, "count": 2}


def test_message_round_trip() -> None:
    for msg in (
        Message("heartbeat", {"t": 1.5, "step": 3}),
        Message("stop", {}),
        Message("eval", {"accuracy": 0.5, "names": ["a", "b"], "nested": {"k": None}}),
    ):
        out = decode(received(encode_message(msg)))
        assert out == msg


def test_frames_to_bytes_round_trip() -> None:
    batch = make_batch()
    frames = encode_batch(batch)
    blob = frames_to_bytes(frames)
    back = bytes_to_frames(blob)
    assert [bytes(f) for f in back] == received(frames)
    out = decode(back)
    assert_batches_identical(batch, out)
    # Padding keeps the decoded arrays aligned for their dtype.
    assert all(ep.old_logp.flags.aligned for ep in out.episodes)
    # A uint8 numpy array (e.g. a broadcast tensor's .numpy()) works as the blob too.
    arr = np.frombuffer(blob, dtype=np.uint8).copy()
    assert_batches_identical(batch, decode(bytes_to_frames(arr)))
    # Messages and empty frame lists survive too.
    assert decode(bytes_to_frames(frames_to_bytes(GOOD_MESSAGE))) == decode(GOOD_MESSAGE)
    assert bytes_to_frames(frames_to_bytes([])) == []
    assert [bytes(f) for f in bytes_to_frames(frames_to_bytes([b"", b"abc"]))] == [b"", b"abc"]


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"garbage",
        b"GRPOFRM1",
        b"GRPOFRM1" + (1 << 62).to_bytes(8, "little"),
        b"XXXXXXXX" + (0).to_bytes(8, "little"),
    ],
)
def test_bytes_to_frames_rejects_garbage(blob: bytes) -> None:
    with pytest.raises(FrameError):
        bytes_to_frames(blob)


def test_bytes_to_frames_rejects_truncated_and_padded() -> None:
    blob = frames_to_bytes(GOOD_FRAMES)
    for cut in (1, 7, 8, len(blob) // 2):
        with pytest.raises(FrameError):
            bytes_to_frames(blob[:-cut])
    with pytest.raises(FrameError):
        bytes_to_frames(blob + b"\0" * 8)


# --------------------------------------------------------------------------- batch API


def test_groups_and_select_groups() -> None:
    batch = make_batch(num_groups=4, group_size=3)
    assert batch.num_groups == 4
    groups = batch.groups()
    assert len(groups) == 4 and all(len(g) == 3 for g in groups)
    assert all(len({ep.group_id for ep in g}) == 1 for g in groups)
    sub = batch.select_groups(1, 3)
    assert sub.num_groups == 2
    for got, want in zip(sub.episodes, batch.episodes[3:9], strict=True):
        assert_episodes_identical(want, got)
    assert np.shares_memory(sub.columns.old_logp, batch.columns.old_logp)  # views, not copies
    assert (sub.policy_version, sub.seq, sub.sampler_id, sub.stats) == (
        batch.policy_version,
        batch.seq,
        batch.sampler_id,
        batch.stats,
    )
    assert sub.stats is not batch.stats
    for bad in ((0, 0), (2, 1), (-1, 2), (0, 5)):
        with pytest.raises(ValueError):
            batch.select_groups(*bad)


def test_episodes_list_is_stored_as_tuple() -> None:
    batch = make_batch(num_groups=1, group_size=2)
    again = EpisodeBatch(list(batch.episodes), 2, 0, 0)
    assert isinstance(again.episodes, tuple)


def _replace(ep: Episode, **kw: Any) -> Episode:
    fields = {k: getattr(ep, k) for k in Episode.__dataclass_fields__}
    fields.update(kw)
    return Episode(**fields)


def _masked(ep: Episode, value: int, dtype: type, extra: int = 0) -> Episode:
    """`ep` with the long enough (plus `extra`) loss mask of `value`s, as `dtype`."""
    return _replace(ep, loss_mask=np.full(len(ep.completion_ids) + extra, value, dtype))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda eps: eps[:3], "multiple of group_size"),
        (lambda eps: (), "multiple of group_size"),
        (lambda eps: (_replace(eps[0], group_id=999), *eps[1:]), "mixes group_ids"),
        (lambda eps: (_replace(eps[0], old_logp=np.zeros(99, np.float32)), *eps[1:]), "old_logp"),
        (lambda eps: (_replace(eps[1], ref_logp=np.zeros(99, np.float32)), *eps[1:]), "ref_logp"),
        (
            lambda eps: (_replace(eps[2], rollout_logp=np.zeros(99, np.float32)), *eps[1:]),
            "rollout_logp",
        ),
        (lambda eps: (_replace(eps[0], finish_reason="eos"), *eps[1:]), "finish_reason"),
        (lambda eps: (_replace(eps[0], prompt_ids=[1, 2]), *eps[1:]), "numpy array"),
        (
            lambda eps: (_replace(eps[0], completion_ids=np.zeros((2, 2), np.int32)), *eps[1:]),
            "1-D",
        ),
        (lambda eps: (_replace(eps[0], group_id=True), *eps[1:]), "group_id"),
        (lambda eps: ("not an episode", *eps[1:]), "not Episode"),
        (lambda eps: (_masked(eps[0], 1, np.uint8, extra=1), *eps[1:]), "loss_mask has length"),
        (lambda eps: (_masked(eps[0], 1, np.float32), *eps[1:]), "loss_mask has dtype"),
        # another integer type could wrap when cast (256 -> 0); a value 2 means nothing
        (lambda eps: (_masked(eps[0], 256, np.int64), *eps[1:]), "loss_mask has dtype"),
        (lambda eps: (_masked(eps[0], 256, np.uint16), *eps[1:]), r"256, outside \[0, 1\]"),
        (lambda eps: (_masked(eps[0], 2, np.uint8), *eps[1:]), "loss_mask holds 2, above 1"),
    ],
)
def test_post_init_errors(mutate: Any, match: str) -> None:
    batch = make_batch(num_groups=2, group_size=4)
    with pytest.raises(ValueError, match=match):
        EpisodeBatch(mutate(batch.episodes), 4, 0, 0)


def test_post_init_bad_group_size() -> None:
    eps = make_batch(num_groups=1, group_size=2).episodes
    for g in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="group_size"):
            EpisodeBatch(eps, g, 0, 0)


def test_post_init_bad_stats() -> None:
    eps = make_batch(num_groups=1, group_size=2).episodes
    with pytest.raises(ValueError, match="stats"):
        EpisodeBatch(eps, 2, 0, 0, stats={"t": "slow"})


# --------------------------------------------------------------------------- rejection


def test_rejects_truncated_buffer() -> None:
    frames = list(GOOD_FRAMES)
    frames[2] = frames[2][:-1]
    with pytest.raises(FrameError, match="checksum"):
        decode(frames)
    # Even with a checksum that matches, the size check catches it.
    with pytest.raises(FrameError, match="bytes for"):
        decode(seal(bytes(GOOD_FRAMES[0])[8:], frames[1:]))


def test_rejects_extra_and_missing_frames() -> None:
    """Sealed again with the frame added or left out, so the checksum passes and the count of
    frames against the header's array descriptors is what refuses them."""
    header, arrays, n = packed_header(GOOD_FRAMES), GOOD_FRAMES[1:], len(GOOD_FRAMES)
    with pytest.raises(FrameError, match=f"got {n + 1} frames, expected {n}"):
        decode(seal(header, [*arrays, b"\0" * 4]))
    with pytest.raises(FrameError, match=f"got {n - 1} frames, expected {n}"):
        decode(seal(header, arrays[:-1]))
    with pytest.raises(FrameError, match="message has 2 frames, expected 1"):
        decode(seal(packed_header(GOOD_MESSAGE), [b""]))
    with pytest.raises(FrameError, match="got 0 frames"):
        decode([])
    with pytest.raises(FrameError, match="got 50 frames"):
        decode([b""] * 50)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"magic": b"NOTGRPO"}, "magic"),
        ({"magic": ...}, "magic"),
        ({"schema": SCHEMA_VERSION + 1}, "schema"),
        ({"schema": True}, "schema"),
        ({"kind": "weights"}, "kind"),
        ({"extra": 1}, "unexpected"),
        ({"seq": ...}, "missing"),
        ({"seq": "17"}, "seq"),
        ({"group_size": True}, "group_size"),
        ({"group_size": 3}, "multiple of group_size"),
        ({"sampler_id": 3}, "sampler_id"),
        ({"stats": {"t": "x"}}, "stats"),
        ({"reward": [0.0, math.nan, 0.0, 0.0]}, "finite"),
        ({"reward": [0.0, math.inf, 0.0, 0.0]}, "finite"),
        ({"reward": [0.0, "1", 0.0, 0.0]}, "finite"),
        ({"reward": [0.0, 0.0, 0.0]}, "reward_info"),
        ({"reward": []}, "non-empty"),
        ({"finish_reason": ["stop", "stop", "eos", "stop"]}, "finish_reason"),
        ({"group_id": [1, 2, 3, 3]}, "mixes group_ids"),
        ({"group_id": [1, 1, 3.0, 3]}, "group_id"),
        ({"reward_info": [{}, {}, {}, {"a": [1]}]}, "JSON scalar"),
        ({"reward_info": [{}, {}, {}, 7]}, "reward_info"),
        ({"has_rollout": False}, "unexpected fields"),  # schema 1's flag
        ({"arrays": "nope"}, "descriptors"),
    ],
)
def test_rejects_bad_header(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode(with_header(GOOD_FRAMES, **changes))


def _with_array(index: int, **desc_changes: Any) -> list[bytes]:
    arrays = header_of(GOOD_FRAMES)["arrays"]
    arrays[index].update(desc_changes)
    return with_header(GOOD_FRAMES, arrays=arrays)


@pytest.mark.parametrize(
    ("index", "changes", "match"),
    [
        (0, {"dtype": "int64"}, "not allowed"),
        (0, {"dtype": "float32"}, "must be int32"),
        (2, {"dtype": "object"}, "not allowed"),
        (2, {"dtype": 7}, "not allowed"),
        (1, {"name": "old_logp"}, "expected"),
        (1, {"count": -1}, "count"),
        (1, {"count": 1 << 62}, "bytes for"),
        (3, {"count": "3"}, "count"),
    ],
)
def test_rejects_bad_array_descriptor(index: int, changes: dict[str, Any], match: str) -> None:
    with pytest.raises(FrameError, match=match):
        decode(_with_array(index, **changes))


def test_rejects_extra_array_descriptor_field() -> None:
    arrays = header_of(GOOD_FRAMES)["arrays"]
    arrays[0]["shape"] = [3]
    with pytest.raises(FrameError, match="unexpected"):
        decode(with_header(GOOD_FRAMES, arrays=arrays))


def test_rejects_a_bad_loss_mask_frame() -> None:
    frames = received(encode_batch(make_batch(seed=1, num_groups=2, group_size=2, mask=True)))
    header = bytes(frames[0])[8:]
    mask = bytearray(frames[-1])
    mask[0] = 2
    with pytest.raises(FrameError, match="loss_mask holds 2, above 1"):
        decode(seal(header, [*frames[1:-1], bytes(mask)]))
    with pytest.raises(FrameError, match="loss_mask: 1 bytes for"):
        decode(seal(header, [*frames[1:-1], frames[-1][:1]]))
    arrays = header_of(frames)["arrays"]
    arrays[-1]["dtype"] = "float32"
    with pytest.raises(FrameError, match="must be uint8"):
        decode(with_header(frames, arrays=arrays))


def test_rejects_mismatched_lengths() -> None:
    h = header_of(GOOD_FRAMES)
    lens = h["completion_len"]
    bad = [lens[0] + 1, *lens[1:]]
    with pytest.raises(FrameError, match="does not sum"):
        decode(with_header(GOOD_FRAMES, completion_len=bad))
    neg = [-1, lens[1] + lens[0] + 1, *lens[2:]]
    with pytest.raises(FrameError, match="< 0"):
        decode(with_header(GOOD_FRAMES, completion_len=neg))
    with pytest.raises(FrameError, match="prompt_len"):
        decode(with_header(GOOD_FRAMES, prompt_len=h["prompt_len"][:-1]))


@pytest.mark.parametrize(
    "frames",
    [
        [b"garbage"],
        [b"\xc1"],  # msgpack "never used" byte
        [b""],
        [b"\x93\x01\x02\x03"],  # a msgpack list, not a map
        seal(msgpack.packb({1: 2})),  # int map key (strict_map_key)
        seal(msgpack.packb({"magic": MAGIC}) + b"trailing"),
        [b"\xdd\xff\xff\xff\xff"],  # array32 claiming 4G entries
        [b"\x91" * 100_000],  # deep nesting
        ["not bytes"],
        [12345],
        [None],
        b"raw bytes, not a frame list",
        None,
    ],
)
def test_rejects_garbage(frames: Any) -> None:
    with pytest.raises(FrameError):
        decode(frames)


def test_rejects_oversize() -> None:
    total = sum(len(f) for f in GOOD_FRAMES)
    assert isinstance(decode(GOOD_FRAMES, max_frame_bytes=total), EpisodeBatch)
    with pytest.raises(FrameError, match="limit"):
        decode(GOOD_FRAMES, max_frame_bytes=total - 1)
    with pytest.raises(FrameError):
        decode(GOOD_FRAMES, max_frame_bytes=len(GOOD_FRAMES[0]) - 1)


def test_rejects_bad_message() -> None:
    h = header_of(GOOD_MESSAGE)
    for k, v in (("msg_kind", ""), ("msg_kind", 3), ("body", [1]), ("extra", 0)):
        bad = dict(h)
        bad[k] = v
        with pytest.raises(FrameError):
            decode(seal(msgpack.packb(bad, use_bin_type=True)))
    with pytest.raises(FrameError):
        decode(seal(msgpack.packb({**h, "body": {b"k": 1}}, use_bin_type=True)))


# --------------------------------------------------------------------------- fuzzing

# Four fuzz tests x 2,500 examples: at least 10,000 malformed messages through the decoder.
FUZZ = settings(
    max_examples=2500,
    deadline=None,
    derandomize=True,
    database=None,  # keep runs reproducible and leave no .hypothesis/ behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode_checked(frames: Any) -> EpisodeBatch | Message | None:
    """What decode makes of `frames`, or None when one of its checks refused them.

    decode turns every exception into a FrameError so that a receiver can drop the frame; one
    that no check raised (an IndexError, a numpy ValueError) comes as UncheckedFrameError and
    fails the test: a field reached code that had not validated it.
    """
    try:
        return decode(frames, max_frame_bytes=1 << 20)
    except FrameError as e:
        assert not isinstance(e, UncheckedFrameError), f"refused by no check: {e}"
        return None


def canonical(value: Any) -> str:
    """A msgpack value as text, equal exactly when the values are: maps in any key order, NaN
    equal to itself, and 1, 1.0 and True told apart (== does neither)."""
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{canonical(k)}: {canonical(v)}"
                                      for k, v in value.items())) + "}"  # fmt: skip
    if isinstance(value, list):
        return "[" + ", ".join(map(canonical, value)) + "]"
    return repr(value)


def assert_valid_batch(batch: EpisodeBatch) -> None:
    """What the trainer relies on in any batch, checked here rather than by the code under
    test."""
    g, episodes, columns = batch.group_size, batch.episodes, batch.columns
    assert type(g) is int and g >= 1 and len(episodes) >= 1 and len(episodes) % g == 0
    assert all(len({ep.group_id for ep in group}) == 1 for group in batch.groups())
    assert sum(len(ep.prompt_ids) for ep in episodes) == len(columns.prompt_ids)
    assert sum(len(ep.completion_ids) for ep in episodes) == len(columns.completion_ids)
    for ep in episodes:
        assert ep.prompt_ids.dtype == ep.completion_ids.dtype == np.int32
        for name in ("old_logp", "ref_logp", "rollout_logp", "loss_mask", "token_versions"):
            per_token = getattr(ep, name)
            assert per_token is None or per_token.shape == ep.completion_ids.shape, name
        assert ep.loss_mask is None or set(ep.loss_mask.tolist()) <= {0, 1}
        # no token older than the batch claims (its policy_version: its oldest token's)
        assert ep.token_versions is None or (ep.token_versions >= batch.policy_version).all()
        assert math.isfinite(ep.reward) and ep.finish_reason in ("stop", "length")
        assert all(type(k) is str and isinstance(v, (str, int, float, bool, type(None)))
                   for k, v in ep.reward_info.items())  # fmt: skip


def assert_decoded_faithfully(sent: list[bytes], out: EpisodeBatch | Message) -> None:
    """Frames that decode were decoded to what they hold: encoded again, they give back the
    header that was sent (rewards and stats as the floats decode makes of them) and the same
    arrays; and a batch is as valid as any other."""
    header = header_of(sent)
    if isinstance(out, EpisodeBatch):
        assert_valid_batch(out)
        again = encode_batch(out)
        assert received(again[1:]) == received(sent[1:])
        header["reward"] = [float(r) for r in header["reward"]]
        header["stats"] = {k: float(v) for k, v in header["stats"].items()}
    else:
        assert isinstance(out, Message) and isinstance(out.kind, str) and out.kind
        again = encode_message(out)
    assert canonical(header_of(again)) == canonical(header)


def refused_or_faithful(frames: list[bytes]) -> None:
    """decode refuses `frames` by one of its checks, or decodes them faithfully."""
    out = decode_checked(frames)
    if out is not None:
        assert_decoded_faithfully(frames, out)


def test_valid_frames_pass_the_fuzz_tests_checks() -> None:
    """The checks the fuzz tests make of whatever decodes hold for the encoder's own frames."""
    masked = received(encode_batch(make_batch(seed=4, rollout=False, mask=True)))
    versioned = received(encode_batch(make_batch(seed=4, versions=True)))
    for frames in (GOOD_FRAMES, GOOD_MESSAGE, masked, versioned):
        assert decode_checked(frames) is not None
        refused_or_faithful(frames)


@FUZZ
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=8))
def test_fuzz_random_frames(frames: list[bytes]) -> None:
    # As they are, for the checks before the checksum (frame count, frame 0's length); sealed,
    # for the msgpack parser on a random header; sealed behind the valid header, for the
    # frame count and size checks.
    refused_or_faithful(frames)
    if frames:
        refused_or_faithful(seal(frames[0], frames[1:]))
    refused_or_faithful(seal(packed_header(GOOD_FRAMES), frames))
    with contextlib.suppress(FrameError):
        bytes_to_frames(b"".join(frames))


@FUZZ
@given(
    st.sampled_from([GOOD_FRAMES, GOOD_MESSAGE]),
    st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 7)), min_size=1, max_size=4),
    # Half the examples keep the whole header: a cut one mostly stops in msgpack's parser.
    st.none() | st.integers(0, 1 << 30),
)
def test_fuzz_bit_flipped_headers(
    frames: list[bytes], flips: list[tuple[int, int]], cut: int | None
) -> None:
    # Bits flipped in the msgpack header (and its tail maybe cut off), then sealed again: the
    # checksum passes, so the parser and the decoder's checks are what judge it.
    header = bytearray(packed_header(frames))
    for pos, bit in flips:
        header[pos % len(header)] ^= 1 << bit
    if cut is not None:
        header = header[: cut % (len(header) + 1)]
    refused_or_faithful(seal(bytes(header), frames[1:]))


@FUZZ
@given(
    st.sampled_from([GOOD_FRAMES, GOOD_MESSAGE]),
    st.integers(0, 1 << 30),
    st.integers(0, 1 << 30),
    st.integers(0, 7),
)
def test_fuzz_any_flipped_bit_fails_the_checksum(
    frames: list[bytes], which: int, pos: int, bit: int
) -> None:
    """A corrupted reward, token id or log-prob is never decoded as data."""
    frames = [bytearray(f) for f in frames]
    target = frames[which % len(frames)]
    if not target:
        return
    target[pos % len(target)] ^= 1 << bit
    with pytest.raises(FrameError):
        decode([bytes(f) for f in frames])


_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=8,
)


def places_in(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path to every field and list entry inside a msgpack value, at any depth."""
    if isinstance(value, dict):
        inside = list(value.items())
    elif isinstance(value, list):
        inside = list(enumerate(value))
    else:
        inside = []
    found = []
    for key, child in inside:
        found += [(*path, key), *places_in(child, (*path, key))]
    return found


def replaced(header: dict[str, Any], place: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of `header` with what is at `place` replaced by `value`."""
    header = copy.deepcopy(header)
    *outer, last = place
    container: Any = header
    for key in outer:
        container = container[key]
    container[last] = value
    return header


def resized(buffer: bytes, cut: int) -> bytes:
    """`buffer` cut short by `cut` bytes when `cut` is odd, else lengthened by `cut` zeros."""
    return buffer[: max(0, len(buffer) - cut)] if cut % 2 else buffer + b"\0" * cut


# Each header field, list entry (a reward, a group id...) and array descriptor field.
GOOD_HEADER_PLACES = places_in(header_of(GOOD_FRAMES))
ARRAY_NAMES = [desc["name"] for desc in header_of(GOOD_FRAMES)["arrays"]]


@FUZZ
@given(
    st.sampled_from(GOOD_HEADER_PLACES),
    _MSGPACK_VALUES,
    st.integers(0, 5),
    st.integers(0, 64),
)
def test_fuzz_mutated_fields_and_truncated_buffers(
    place: tuple[Any, ...], value: Any, frame_index: int, cut: int
) -> None:
    # The valid header with one field, list entry or descriptor field replaced by any msgpack
    # value, then sealed again: the checksum passes, the decoder's checks judge it.
    header = replaced(header_of(GOOD_FRAMES), place, value)
    refused_or_faithful(seal(msgpack.packb(header, use_bin_type=True), GOOD_FRAMES[1:]))
    # The valid frames with one of them cut short or lengthened, sealed again: a resized array
    # is refused by its size check, a resized header by the msgpack parser.
    parts = [packed_header(GOOD_FRAMES), *GOOD_FRAMES[1:]]
    i = frame_index % len(parts)
    parts[i] = resized(parts[i], cut)
    frames = seal(parts[0], parts[1:])
    if cut == 0:
        assert_decoded_faithfully(frames, decode(frames))
        return
    if i == 0:
        refusal = "header is not valid msgpack"
    else:
        refusal = f"array {ARRAY_NAMES[i - 1]}: {len(parts[i])} bytes for"
    with pytest.raises(FrameError, match=refusal):
        decode(frames)


def test_the_batch_types_carry_exactly_the_per_token_fields_of_the_table() -> None:
    """The per-token fields are declared once (grpo.core.tokens): an Episode and a batch's
    Columns hold exactly those arrays, so a field added to the table and not to them, or the
    other way round, fails here rather than on the wire."""
    from dataclasses import fields

    from grpo.core.columns import Columns
    from grpo.core.tokens import TOKEN_FIELDS

    table = {f.name for f in TOKEN_FIELDS}
    per_episode = {"reward", "reward_info", "finish_reason", "group_id"}
    assert {f.name for f in fields(Episode)} - per_episode == table
    per_batch = per_episode | {"prompt_len", "completion_len"}
    assert {f.name for f in fields(Columns)} - per_batch == table
