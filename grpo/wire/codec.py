"""The pickle-free ZeroMQ wire codec of episode batches and control messages.

The sampler sends one :class:`EpisodeBatch` as a multipart ZeroMQ message: frame 0 is
a msgpack header (batch fields, per-episode scalars, array descriptors) and frames
1..n are raw little-endian buffers holding each per-episode array concatenated over
the batch.  Decoding validates every field before use and maps the array frames
with ``np.frombuffer`` so the per-episode arrays are zero-copy views of the frames.

Small control messages (heartbeat, stop, done, eval) travel as a single
msgpack frame wrapping a :class:`Message`.

Frame 0 starts with a little-endian XXH3-64 checksum of everything after it: the rest of
frame 0 and every array frame, so a flipped reward or token id is caught, not trained on.
(XXH3 runs at memory speed here, about 8 times zlib's CRC-32, which doubled a 16 MB send.)

Every decode failure is reported as :class:`FrameError`: the trainer must be able to
log and drop a bad frame without crashing, so no other exception type may escape.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from grpo.core.checksum import checksum
from grpo.core.columns import (
    ARRAY_SPECS,
    LEN_DTYPE,
    OPTIONAL_ARRAYS,
    REWARD_DTYPE,
    WIRE_DTYPES,
    Columns,
    is_int,
    is_real,
)
from grpo.core.episode import EpisodeBatch
from grpo.core.names import SAMPLER_ID_RULE, is_sampler_id
from grpo.wire.unpack import unpack_bounded

__all__ = [
    "MAGIC",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "SCHEMA_VERSION",
    "FrameError",
    "Message",
    "UncheckedFrameError",
    "decode",
    "encode_batch",
    "encode_message",
    "seal",
]

MAGIC = b"GRPOEP1"
# 2: old_logp and ref_logp became optional like rollout_logp; 3: a checksum before the header.
# The optional loss_mask (multi-turn answers) came without a new schema, so that single-turn
# frames stay byte for byte what they were; a decoder that predates it refuses a batch that has
# one as an unknown array. The optional teacher_logp (on-policy distillation) came the same way,
# and so did token_versions (continuous generation: each token's weights version, int32), which
# lock-step batches leave out.
SCHEMA_VERSION = 3
MAX_FRAME_BYTES = 1 << 30
# The header only holds scalars, so it stays far below this even for huge batches;
# a tighter bound than the whole message keeps msgpack's own allocations small.
MAX_HEADER_BYTES = 64 << 20
KIND_EPISODES = "episodes"
KIND_MESSAGE = "message"

_MAX_FRAMES = 1 + len(ARRAY_SPECS)
_EPISODE_HEADER_KEYS = frozenset(
    {
        "magic",
        "schema",
        "kind",
        "group_size",
        "policy_version",
        "seq",
        "sampler_id",
        "stats",
        "reward",
        "reward_info",
        "finish_reason",
        "group_id",
        "prompt_len",
        "completion_len",
        "arrays",
    }
)
_MESSAGE_HEADER_KEYS = frozenset({"magic", "schema", "kind", "msg_kind", "body"})
_ARRAY_DESC_KEYS = frozenset({"name", "dtype", "count"})
_SUM = struct.Struct("<Q")


class FrameError(ValueError):
    """A frame that cannot be decoded; the receiver logs and drops it."""


class UncheckedFrameError(FrameError):
    """A frame refused by an exception that no check of the decoder raised (an IndexError, a
    numpy ValueError...): a gap in the validation. Receivers drop it like any FrameError; the
    tests tell it apart, since every refusal should come from a check that names its cause."""


@dataclass(frozen=True)
class Message:
    """A small control message (heartbeat, stop, done, eval); msgpack only.

    ``body`` must be msgpack-able with str keys; tuples come back as lists.
    """

    kind: str
    body: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- encode


def _byte_view(arr: np.ndarray) -> memoryview:
    # A flat byte view keeps ``arr`` alive and lets zmq send it without another copy.
    return memoryview(arr).cast("B")


def encode_batch(batch: EpisodeBatch) -> list[bytes | memoryview]:
    """Multipart frames for ``socket.send_multipart(frames, copy=False)``.

    The array frames are the batch's columns themselves: nothing is gathered or copied.
    """
    c = batch.columns
    specs = [spec for spec in ARRAY_SPECS if getattr(c, spec[0]) is not None]
    arrays = [getattr(c, name) for name, _, _ in specs]
    descs = [
        {"name": name, "dtype": dtype_name, "count": int(arr.shape[0])}
        for (name, dtype_name, _), arr in zip(specs, arrays, strict=True)
    ]
    header = {
        "magic": MAGIC,
        "schema": SCHEMA_VERSION,
        "kind": KIND_EPISODES,
        "group_size": int(batch.group_size),
        "policy_version": int(batch.policy_version),
        "seq": int(batch.seq),
        "sampler_id": batch.sampler_id,
        "stats": {k: float(v) for k, v in batch.stats.items()},
        "reward": c.reward.tolist(),
        "reward_info": list(c.reward_info),
        "finish_reason": list(c.finish_reason),
        "group_id": c.group_id.tolist(),
        "prompt_len": c.prompt_len.tolist(),
        "completion_len": c.completion_len.tolist(),
        "arrays": descs,
    }
    return seal(msgpack.packb(header, use_bin_type=True), [_byte_view(a) for a in arrays])


def seal(header: bytes, arrays: Sequence[Any] = ()) -> list[Any]:
    """Frames for a packed header and its array buffers: the checksum of all of them goes in
    front of the header (the header is small, so the copy is cheap; arrays are not copied)."""
    return [_SUM.pack(checksum([header, *arrays])) + header, *arrays]


def encode_message(msg: Message) -> list[bytes]:
    """One msgpack frame holding a control message."""
    if not isinstance(msg.kind, str) or not msg.kind:
        raise ValueError(f"Message.kind must be a non-empty str, got {msg.kind!r}")
    if not isinstance(msg.body, dict):
        raise ValueError("Message.body must be a dict")
    header = {
        "magic": MAGIC,
        "schema": SCHEMA_VERSION,
        "kind": KIND_MESSAGE,
        "msg_kind": msg.kind,
        "body": msg.body,
    }
    return seal(msgpack.packb(header, use_bin_type=True))


# --------------------------------------------------------------------------- decode


def as_bytes(frame: Any) -> memoryview:
    """A flat byte view of a bytes/memoryview/zmq.Frame without copying."""
    try:
        # zmq.Frame exposes its data via .buffer; plain buffers are used directly.
        buf = frame.buffer if hasattr(frame, "buffer") else frame
        mv = memoryview(buf)
        if not mv.c_contiguous:
            raise FrameError("frame buffer is not contiguous")
        return mv if (mv.format == "B" and mv.ndim == 1) else mv.cast("B")
    except FrameError:
        raise
    except Exception as e:
        raise FrameError(f"frame is not a byte buffer: {type(frame).__name__}") from e


def require(cond: bool, what: str) -> None:
    if not cond:
        raise FrameError(what)


def _unpack_header(raw: memoryview, limit: int) -> dict[str, Any]:
    require(0 < raw.nbytes <= limit, f"header size {raw.nbytes} not in 1..{limit}")
    try:
        # Bounded by what the header's size can hold, not only by each length: an empty
        # map or a declared array length costs far more than its byte (grpo.wire.unpack).
        header = unpack_bounded(raw)
    except Exception as e:  # msgpack raises many types (ExtraData, StackError, ValueError...)
        raise FrameError(f"header is not valid msgpack: {type(e).__name__}: {e}") from e
    require(isinstance(header, dict), "header is not a msgpack map")
    require(header.get("magic") == MAGIC, "bad magic")
    require(
        header.get("schema") == SCHEMA_VERSION and is_int(header.get("schema")),
        f"unsupported schema {header.get('schema')!r}",
    )
    return header


def _check_keys(d: dict[str, Any], expected: frozenset[str], what: str) -> None:
    keys = set(d)
    if keys != expected:
        missing = sorted(expected - keys)
        extra = sorted(map(repr, keys - expected))
        raise FrameError(f"{what}: missing fields {missing}, unexpected fields {extra}")


def _int_array(header: dict[str, Any], key: str, n: int) -> np.ndarray:
    v = header[key]
    require(isinstance(v, list) and len(v) == n, f"{key} must be a list of {n} ints")
    # msgpack yields exact ints; this refuses floats, bools and strings in one pass (the
    # types are gathered in C: per-element Python was a fifth of decoding 64 episodes).
    require(set(map(type, v)) <= {int}, f"{key} holds a non-int")
    try:
        return np.array(v, dtype=LEN_DTYPE)
    except OverflowError as e:
        raise FrameError(f"{key} holds an int outside int64") from e


def _decode_message(header: dict[str, Any], frames: list[memoryview]) -> Message:
    _check_keys(header, _MESSAGE_HEADER_KEYS, "message header")
    require(len(frames) == 1, f"message has {len(frames)} frames, expected 1")
    kind, body = header["msg_kind"], header["body"]
    require(isinstance(kind, str) and bool(kind), "msg_kind must be a non-empty str")
    require(isinstance(body, dict), "message body must be a map")
    require(all(isinstance(k, str) for k in body), "message body keys must be str")
    return Message(kind=kind, body=body)


def _decode_arrays(
    header: dict[str, Any], frames: list[memoryview], lens: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Validate the array descriptors against the frames and map them zero-copy.

    The descriptors name the arrays present: the token ids always, then any of
    OPTIONAL_ARRAYS, in spec order.
    """
    descs = header["arrays"]
    require(isinstance(descs, list), "arrays must be a list of descriptors")
    require(all(isinstance(d, dict) for d in descs), "array descriptor is not a map")
    # A name that is not a str (a list is not even hashable) names no array: the count or the
    # name check below refuses its descriptor.
    present = {d.get("name") for d in descs if isinstance(d.get("name"), str)}
    specs = [s for s in ARRAY_SPECS if s[0] not in OPTIONAL_ARRAYS or s[0] in present]
    require(len(descs) == len(specs), f"arrays must list {len(specs)} known descriptors")
    require(len(frames) == 1 + len(specs), f"got {len(frames)} frames, expected {1 + len(specs)}")
    out: dict[str, np.ndarray] = {}
    for desc, buf, (name, dtype_name, len_key) in zip(descs, frames[1:], specs, strict=True):
        require(isinstance(desc, dict), "array descriptor is not a map")
        _check_keys(desc, _ARRAY_DESC_KEYS, "array descriptor")
        require(desc["name"] == name, f"array {desc['name']!r} where {name!r} was expected")
        require(
            isinstance(desc["dtype"], str) and desc["dtype"] in WIRE_DTYPES,
            f"array {name}: dtype {desc['dtype']!r} not allowed",
        )
        require(desc["dtype"] == dtype_name, f"array {name}: dtype must be {dtype_name}")
        count = desc["count"]
        require(is_int(count) and count >= 0, f"array {name}: bad count {count!r}")
        dtype = WIRE_DTYPES[dtype_name]
        require(
            buf.nbytes == count * dtype.itemsize,
            f"array {name}: {buf.nbytes} bytes for {count} x {dtype_name}",
        )
        require(
            int(lens[len_key].sum()) == count, f"array {name}: {len_key} does not sum to {count}"
        )
        out[name] = np.frombuffer(buf, dtype=dtype, count=count)
    return out


def _decode_batch(header: dict[str, Any], frames: list[memoryview]) -> EpisodeBatch:
    _check_keys(header, _EPISODE_HEADER_KEYS, "episodes header")
    for key in ("group_size", "policy_version", "seq"):
        require(is_int(header[key]), f"{key} must be an int")
    require(is_sampler_id(header["sampler_id"]), f"sampler_id must be {SAMPLER_ID_RULE}")
    stats = header["stats"]
    require(isinstance(stats, dict), "stats must be a map")
    for k, v in stats.items():
        require(isinstance(k, str) and is_real(v), "stats must map str to float")

    rewards = header["reward"]
    require(isinstance(rewards, list) and len(rewards) > 0, "reward must be a non-empty list")
    n = len(rewards)
    require(set(map(type, rewards)) <= {int, float}, "reward holds a non-finite number")
    infos, reasons = header["reward_info"], header["finish_reason"]
    require(isinstance(infos, list) and len(infos) == n, f"reward_info must list {n} maps")
    require(
        isinstance(reasons, list) and set(map(type, reasons)) <= {str},
        f"finish_reason must list {n} strs",
    )
    lens = {key: _int_array(header, key, n) for key in ("prompt_len", "completion_len")}
    group_id = _int_array(header, "group_id", n)
    for key, arr in lens.items():
        # Bounding each length keeps their int64 sum exact (n is far below 2**31).
        require(bool(((arr >= 0) & (arr < 1 << 31)).all()), f"{key} holds a value < 0 or >= 2**31")
    arrays = _decode_arrays(header, frames, lens)
    try:
        columns = Columns(
            **({name: None for name in OPTIONAL_ARRAYS} | arrays),
            prompt_len=lens["prompt_len"],
            completion_len=lens["completion_len"],
            reward=np.array(rewards, dtype=REWARD_DTYPE),
            group_id=group_id,
            reward_info=tuple(infos),
            finish_reason=tuple(reasons),
        )
        return EpisodeBatch.from_columns(
            columns,
            group_size=header["group_size"],
            policy_version=header["policy_version"],
            seq=header["seq"],
            sampler_id=header["sampler_id"],
            stats={k: float(v) for k, v in stats.items()},
        )
    except (ValueError, TypeError) as e:
        raise FrameError(f"invalid batch: {e}") from e


def decode(frames: Sequence[Any], max_frame_bytes: int = MAX_FRAME_BYTES) -> EpisodeBatch | Message:
    """Decode frames from :func:`encode_batch` / :func:`encode_message`.

    Accepts bytes, memoryviews or ``zmq.Frame`` objects (anything with ``.buffer``).
    Episode arrays are read-only views of the frame buffers, so keep the frames
    alive as long as the arrays (the views hold references, so this is automatic).
    Raises only :class:`FrameError`; ``max_frame_bytes`` bounds the whole message.
    """
    try:
        return _decode(frames, max_frame_bytes)
    except FrameError:
        raise
    except Exception as e:  # a validation gap must still surface as a droppable frame
        raise UncheckedFrameError(f"undecodable frames: {type(e).__name__}: {e}") from e


def _decode(frames: Sequence[Any], max_frame_bytes: int) -> EpisodeBatch | Message:
    require(isinstance(frames, Sequence) and not isinstance(frames, (bytes, str)), "bad frames")
    require(1 <= len(frames) <= _MAX_FRAMES, f"got {len(frames)} frames")
    views = [as_bytes(f) for f in frames]
    total = sum(v.nbytes for v in views)
    require(total <= max_frame_bytes, f"message is {total} bytes > limit {max_frame_bytes}")
    require(views[0].nbytes > _SUM.size, "frame 0 is too short for a checksum")
    (expected,) = _SUM.unpack(views[0][: _SUM.size])
    views[0] = views[0][_SUM.size :]
    got = checksum(views)
    require(got == expected, f"checksum mismatch ({got:016x}, frame says {expected:016x})")
    header = _unpack_header(views[0], min(MAX_HEADER_BYTES, max_frame_bytes))
    kind = header.get("kind")
    if kind == KIND_EPISODES:
        return _decode_batch(header, views)
    if kind == KIND_MESSAGE:
        return _decode_message(header, views)
    raise FrameError(f"unknown kind {kind!r}")
