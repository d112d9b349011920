"""Episodes, episode batches, and their pickle-free ZeroMQ wire codec.

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

import numbers
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

import msgpack
import numpy as np

from grpo.checksum import checksum

__all__ = [
    "FINISH_REASONS",
    "MAGIC",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "SCHEMA_VERSION",
    "Episode",
    "EpisodeBatch",
    "FrameError",
    "Message",
    "bytes_to_frames",
    "decode",
    "encode_batch",
    "encode_message",
    "frames_to_bytes",
    "seal",
]

MAGIC = b"GRPOEP1"
# 2: old_logp and ref_logp became optional like rollout_logp; 3: a checksum before the header
SCHEMA_VERSION = 3
MAX_FRAME_BYTES = 1 << 30
# The header only holds scalars, so it stays far below this even for huge batches;
# a tighter bound than the whole message keeps msgpack's own allocations small.
MAX_HEADER_BYTES = 64 << 20
FINISH_REASONS = frozenset({"stop", "length"})

KIND_EPISODES = "episodes"
KIND_MESSAGE = "message"

# Wire dtypes are explicit little-endian so sender and receiver agree on any host.
_WIRE_DTYPES: dict[str, np.dtype] = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4")}

# (array name, wire dtype name, which per-episode length it follows), in frame order.
_ARRAY_SPECS: tuple[tuple[str, str, str], ...] = (
    ("prompt_ids", "int32", "prompt_len"),
    ("completion_ids", "int32", "completion_len"),
    ("old_logp", "float32", "completion_len"),
    ("ref_logp", "float32", "completion_len"),
    ("rollout_logp", "float32", "completion_len"),
)
_MAX_FRAMES = 1 + len(_ARRAY_SPECS)
# Per-token log-probs a batch may leave out (None for the whole batch): the old-policy and
# reference ones when the trainer computes them (train.logprobs_on: trainer), the rollout
# engine's when the backend reports none.
OPTIONAL_ARRAYS = ("old_logp", "ref_logp", "rollout_logp")
_ARRAY_DTYPES = {name: dtype for name, dtype, _ in _ARRAY_SPECS}
_ARRAYS_BY_LENGTH = {
    lens: tuple(name for name, _, by in _ARRAY_SPECS if by == lens)
    for lens in ("prompt_len", "completion_len")
}
_LEN_DTYPE = np.dtype(np.int64)  # per-episode lengths and group ids
_REWARD_DTYPE = np.dtype(np.float64)

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
_JSON_SCALARS = (str, int, float, bool, type(None))

# frames_to_bytes layout: magic, u64 frame count, u64 lengths, 8-byte aligned payloads.
_BLOB_MAGIC = b"GRPOFRM1"
_U64 = struct.Struct("<Q")
_SUM = struct.Struct("<Q")
_ALIGN = 8


class FrameError(ValueError):
    """A frame that cannot be decoded; the receiver logs and drops it."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True, eq=False)
class Episode:
    """One sampled answer to one question.

    ``eq=False`` because dataclass equality on numpy arrays is ambiguous.
    """

    prompt_ids: np.ndarray  # int32 [P]
    completion_ids: np.ndarray  # int32 [C], C >= 0
    old_logp: np.ndarray | None  # float32 [C], under the sampling policy (None: trainer's job)
    ref_logp: np.ndarray | None  # float32 [C], under the frozen reference model (idem)
    reward: float
    reward_info: dict[str, Any]  # JSON-able scalars
    finish_reason: str  # "stop" | "length"
    group_id: int  # dataset row index; shared by the episodes of one group
    rollout_logp: np.ndarray | None = None  # float32 [C], as the rollout engine computed it


@dataclass(frozen=True, eq=False)
class Columns:
    """The arrays of a batch, each per-token array concatenated over its episodes.

    This is the wire layout, so a batch held as columns is sent without gathering
    and received as zero-copy views.
    """

    prompt_ids: np.ndarray  # int32, all prompts back to back
    completion_ids: np.ndarray  # int32, all completions back to back
    old_logp: np.ndarray | None  # float32, aligned with completion_ids, or None (whole batch)
    ref_logp: np.ndarray | None  # idem
    rollout_logp: np.ndarray | None  # idem
    prompt_len: np.ndarray  # int64 [N]
    completion_len: np.ndarray  # int64 [N]
    reward: np.ndarray  # float64 [N]
    group_id: np.ndarray  # int64 [N]
    reward_info: tuple[dict[str, Any], ...]
    finish_reason: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.reward)


class EpisodeBatch:
    """Whole groups of episodes sampled with one policy version, stored as :class:`Columns`.

    Groups are contiguous: ``episodes[g * group_size:(g + 1) * group_size]`` is group g.
    Build one from episodes (``EpisodeBatch(episodes, ...)``, which gathers their arrays
    once) or from columns (:meth:`from_columns`, what the decoder does); ``episodes``
    are then made on first use as views of the columns.
    """

    def __init__(
        self,
        episodes: Sequence[Episode],
        group_size: int,
        policy_version: int,
        seq: int,
        sampler_id: str = "sampler-0",
        stats: dict[str, float] | None = None,
    ) -> None:
        episodes = tuple(episodes)
        for i, ep in enumerate(episodes):
            _check_episode(ep, i)
        self._init(_gather(episodes), group_size, policy_version, seq, sampler_id, stats or {})
        self._episodes: tuple[Episode, ...] | None = episodes

    @classmethod
    def from_columns(
        cls,
        columns: Columns,
        group_size: int,
        policy_version: int,
        seq: int,
        sampler_id: str = "sampler-0",
        stats: dict[str, float] | None = None,
    ) -> EpisodeBatch:
        _check_columns(columns)
        batch = cls.__new__(cls)
        batch._init(columns, group_size, policy_version, seq, sampler_id, stats or {})
        batch._episodes = None
        return batch

    def _init(
        self,
        columns: Columns,
        group_size: int,
        policy_version: int,
        seq: int,
        sampler_id: str,
        stats: dict[str, float],
    ) -> None:
        self.columns = columns
        self.group_size = group_size
        self.policy_version = policy_version
        self.seq = seq
        self.sampler_id = sampler_id
        self.stats = stats
        _check_batch(self)

    @property
    def episodes(self) -> tuple[Episode, ...]:
        if self._episodes is None:
            self._episodes = _scatter(self.columns)
        return self._episodes

    def __len__(self) -> int:
        return len(self.columns)

    @property
    def num_groups(self) -> int:
        return len(self) // self.group_size

    def groups(self) -> list[tuple[Episode, ...]]:
        """The episodes split into their groups, in order."""
        g, eps = self.group_size, self.episodes
        return [eps[i * g : (i + 1) * g] for i in range(self.num_groups)]

    def with_arrays(self, **per_episode: Sequence[np.ndarray]) -> EpisodeBatch:
        """A new batch with optional per-token arrays (old_logp, ref_logp, rollout_logp) set
        from one array per episode, e.g. the log-probs the trainer computed itself."""
        unknown = set(per_episode) - set(OPTIONAL_ARRAYS)
        if unknown:
            raise ValueError(f"with_arrays sets only {OPTIONAL_ARRAYS}, not {sorted(unknown)}")
        columns = self.columns
        for name, parts in per_episode.items():
            if len(parts) != len(self):
                raise ValueError(f"{name}: {len(parts)} arrays for {len(self)} episodes")
            wire = _WIRE_DTYPES[_ARRAY_DTYPES[name]]
            flat = np.concatenate([np.asarray(p, wire) for p in parts]) if parts else None
            columns = replace(columns, **{name: flat})
        return EpisodeBatch.from_columns(
            columns, self.group_size, self.policy_version, self.seq, self.sampler_id, self.stats
        )

    def select_groups(self, start: int, stop: int) -> EpisodeBatch:
        """A new batch holding groups ``[start, stop)``; the arrays are shared, not copied."""
        if not 0 <= start < stop <= self.num_groups:
            raise ValueError(
                f"select_groups({start}, {stop}) needs 0 <= start < stop <= {self.num_groups}"
            )
        g = self.group_size
        columns = _slice_columns(self.columns, start * g, stop * g)
        return EpisodeBatch.from_columns(
            columns, g, self.policy_version, self.seq, self.sampler_id, dict(self.stats)
        )


@dataclass(frozen=True)
class Message:
    """A small control message (heartbeat, stop, done, eval); msgpack only.

    ``body`` must be msgpack-able with str keys; tuples come back as lists.
    """

    kind: str
    body: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- validation


def _is_int(x: object) -> bool:
    # bool is an int subclass, but True is never a sensible count or id.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_1d(arr: object, kinds: str, what: str) -> int:
    """Length of ``arr`` if it is a 1-D array of a dtype kind in ``kinds``."""
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{what} must be a numpy array, got {type(arr).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in kinds:
        raise ValueError(f"{what} has dtype {arr.dtype}, expected kind in {kinds!r}")
    return arr.shape[0]


def _check_episode(ep: object, i: int) -> None:
    """Shape/type checks of one episode; reads only metadata, never copies arrays."""
    if not isinstance(ep, Episode):
        raise ValueError(f"episodes[{i}] is {type(ep).__name__}, not Episode")
    _check_1d(ep.prompt_ids, "iu", f"episodes[{i}].prompt_ids")
    n = _check_1d(ep.completion_ids, "iu", f"episodes[{i}].completion_ids")
    for name in OPTIONAL_ARRAYS:
        if getattr(ep, name) is None:
            continue
        m = _check_1d(getattr(ep, name), "f", f"episodes[{i}].{name}")
        if m != n:
            raise ValueError(f"episodes[{i}].{name} has length {m}, completion_ids has {n}")
    if ep.finish_reason not in FINISH_REASONS:
        raise ValueError(
            f"episodes[{i}].finish_reason={ep.finish_reason!r}, expected one of "
            f"{sorted(FINISH_REASONS)}"
        )
    if not _is_int(ep.group_id):
        raise ValueError(f"episodes[{i}].group_id must be an int, got {ep.group_id!r}")
    if not _is_real(ep.reward):
        raise ValueError(f"episodes[{i}].reward must be a real number, got {ep.reward!r}")
    if not isinstance(ep.reward_info, dict):
        raise ValueError(f"episodes[{i}].reward_info must be a dict")


def _check_columns(c: Columns) -> None:
    """Vectorised checks of a batch's columns: cheap enough for every received batch."""
    n = len(c.reward)
    for name, dtype, shape in (
        ("prompt_len", _LEN_DTYPE, (n,)),
        ("completion_len", _LEN_DTYPE, (n,)),
        ("group_id", _LEN_DTYPE, (n,)),
        ("reward", _REWARD_DTYPE, (n,)),
    ):
        arr = getattr(c, name)
        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
            raise ValueError(f"{name} must be a {dtype} array of shape {shape}")
    if not np.isfinite(c.reward).all():
        raise ValueError("reward holds a value that is not finite")
    for lens_name, names in _ARRAYS_BY_LENGTH.items():
        lens = getattr(c, lens_name)
        if (lens < 0).any():
            raise ValueError(f"{lens_name} holds a value < 0")
        total = int(lens.sum())
        for name in names:
            arr = getattr(c, name)
            if arr is None and name in OPTIONAL_ARRAYS:
                continue
            dtype = _WIRE_DTYPES[_ARRAY_DTYPES[name]]
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 1:
                raise ValueError(f"{name} must be a 1-D {dtype} array")
            if arr.shape[0] != total:
                raise ValueError(f"{name}: {lens_name} does not sum to its {arr.shape[0]} values")
    if len(c.finish_reason) != n or not FINISH_REASONS.issuperset(c.finish_reason):
        raise ValueError(f"finish_reason must list {n} of {sorted(FINISH_REASONS)}")
    if len(c.reward_info) != n:
        raise ValueError(f"reward_info must list {n} maps")
    for info in c.reward_info:
        if not isinstance(info, dict):
            raise ValueError("reward_info entry is not a map")
        for k, v in info.items():
            if not isinstance(k, str) or not isinstance(v, _JSON_SCALARS):
                raise ValueError(f"reward_info[{k!r}] is not a str key with a JSON scalar")


def _check_batch(batch: EpisodeBatch) -> None:
    g = batch.group_size
    if not _is_int(g) or g < 1:
        raise ValueError(f"group_size must be a positive int, got {g!r}")
    n = len(batch.columns)
    if n == 0 or n % g:
        raise ValueError(f"len(episodes)={n} is not a positive multiple of group_size={g}")
    for name in ("policy_version", "seq"):
        if not _is_int(getattr(batch, name)):
            raise ValueError(f"{name} must be an int, got {getattr(batch, name)!r}")
    if not isinstance(batch.sampler_id, str):
        raise ValueError(f"sampler_id must be a str, got {batch.sampler_id!r}")
    if not isinstance(batch.stats, dict) or not all(
        isinstance(k, str) and _is_real(v) for k, v in batch.stats.items()
    ):
        raise ValueError("stats must be a dict[str, float]")
    ids = batch.columns.group_id.reshape(-1, g)
    mixed = np.flatnonzero((ids != ids[:, :1]).any(axis=1))
    if mixed.size:
        gi = int(mixed[0])
        raise ValueError(
            f"group {gi} (episodes {gi * g}..{(gi + 1) * g - 1}) mixes group_ids "
            f"{sorted(set(ids[gi].tolist()))}"
        )


# --------------------------------------------------------------------------- columns


def _gather(eps: tuple[Episode, ...]) -> Columns:
    """Columns of checked episodes: one copy of each array, cast to its wire dtype.

    An optional array (old_logp, ref_logp, rollout_logp) is kept only when every episode
    has one; otherwise it is dropped for the whole batch (the receiver sees None everywhere).
    """
    arrays: dict[str, np.ndarray | None] = {}
    for name, dtype_name in _ARRAY_DTYPES.items():
        if name in OPTIONAL_ARRAYS and any(getattr(ep, name) is None for ep in eps):
            arrays[name] = None
            continue
        # same_kind casting refuses e.g. float -> int, which would be silent garbage.
        # Arrays already in the wire dtype skip the casting path, which is ~10x slower.
        parts, wire = [getattr(ep, name) for ep in eps], _WIRE_DTYPES[dtype_name]
        if not parts:
            arrays[name] = np.zeros(0, wire)
        elif all(p.dtype == wire for p in parts):
            arrays[name] = np.concatenate(parts)
        else:
            arrays[name] = np.concatenate(parts, dtype=wire, casting="same_kind")
    return Columns(
        **arrays,
        prompt_len=np.array([len(ep.prompt_ids) for ep in eps], _LEN_DTYPE),
        completion_len=np.array([len(ep.completion_ids) for ep in eps], _LEN_DTYPE),
        reward=np.array([float(ep.reward) for ep in eps], _REWARD_DTYPE),
        group_id=np.array([int(ep.group_id) for ep in eps], _LEN_DTYPE),
        reward_info=tuple(_plain_info(ep.reward_info, i) for i, ep in enumerate(eps)),
        finish_reason=tuple(ep.finish_reason for ep in eps),
    )


def _offsets(lens: np.ndarray) -> list[int]:
    return [0, *accumulate(lens.tolist())]


def _scatter(c: Columns) -> tuple[Episode, ...]:
    """Episodes whose arrays are views of the columns."""
    p, k = _offsets(c.prompt_len), _offsets(c.completion_len)
    rewards, group_ids = c.reward.tolist(), c.group_id.tolist()
    return tuple(
        Episode(
            prompt_ids=c.prompt_ids[p[i] : p[i + 1]],
            completion_ids=c.completion_ids[k[i] : k[i + 1]],
            old_logp=_part(c.old_logp, k[i], k[i + 1]),
            ref_logp=_part(c.ref_logp, k[i], k[i + 1]),
            reward=rewards[i],
            reward_info=c.reward_info[i],
            finish_reason=c.finish_reason[i],
            group_id=group_ids[i],
            rollout_logp=_part(c.rollout_logp, k[i], k[i + 1]),
        )
        for i in range(len(c))
    )


def _part(arr: np.ndarray | None, start: int, stop: int) -> np.ndarray | None:
    return None if arr is None else arr[start:stop]


def _slice_columns(c: Columns, start: int, stop: int) -> Columns:
    """Episodes ``[start, stop)`` of ``c`` as views."""
    p, k = _offsets(c.prompt_len), _offsets(c.completion_len)
    ps, pe, ks, ke = p[start], p[stop], k[start], k[stop]
    return Columns(
        prompt_ids=c.prompt_ids[ps:pe],
        completion_ids=c.completion_ids[ks:ke],
        old_logp=_part(c.old_logp, ks, ke),
        ref_logp=_part(c.ref_logp, ks, ke),
        rollout_logp=_part(c.rollout_logp, ks, ke),
        prompt_len=c.prompt_len[start:stop],
        completion_len=c.completion_len[start:stop],
        reward=c.reward[start:stop],
        group_id=c.group_id[start:stop],
        reward_info=c.reward_info[start:stop],
        finish_reason=c.finish_reason[start:stop],
    )


# --------------------------------------------------------------------------- encode


def _plain_scalar(v: Any, where: str) -> Any:
    """``v`` as a JSON-able Python scalar (numpy scalars unwrapped), else ValueError."""
    if isinstance(v, np.generic):
        v = v.item()
    if not isinstance(v, _JSON_SCALARS):
        raise ValueError(f"{where} must be a JSON scalar, got {type(v).__name__}")
    return v


def _plain_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    out = {}
    for k, v in info.items():
        if not isinstance(k, str):
            raise ValueError(f"episodes[{i}].reward_info key {k!r} is not a str")
        out[k] = _plain_scalar(v, f"episodes[{i}].reward_info[{k!r}]")
    return out


def _byte_view(arr: np.ndarray) -> memoryview:
    # A flat byte view keeps ``arr`` alive and lets zmq send it without another copy.
    return memoryview(arr).cast("B")


def encode_batch(batch: EpisodeBatch) -> list[bytes | memoryview]:
    """Multipart frames for ``socket.send_multipart(frames, copy=False)``.

    The array frames are the batch's columns themselves: nothing is gathered or copied.
    """
    c = batch.columns
    specs = [spec for spec in _ARRAY_SPECS if getattr(c, spec[0]) is not None]
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


def _as_bytes(frame: Any) -> memoryview:
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


def _require(cond: bool, what: str) -> None:
    if not cond:
        raise FrameError(what)


def _unpack_header(raw: memoryview, limit: int) -> dict[str, Any]:
    _require(0 < raw.nbytes <= limit, f"header size {raw.nbytes} not in 1..{limit}")
    try:
        # unpackb takes the whole buffer (Unpacker's max_buffer_size does not apply);
        # bounding every container by the header size stops a tiny header from
        # claiming a huge array, and max_ext_len=0 refuses ext types outright.
        n = raw.nbytes
        header = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n,
            max_ext_len=0,
        )
    except Exception as e:  # msgpack raises many types (ExtraData, StackError, ValueError...)
        raise FrameError(f"header is not valid msgpack: {type(e).__name__}: {e}") from e
    _require(isinstance(header, dict), "header is not a msgpack map")
    _require(header.get("magic") == MAGIC, "bad magic")
    _require(
        header.get("schema") == SCHEMA_VERSION and _is_int(header.get("schema")),
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
    _require(isinstance(v, list) and len(v) == n, f"{key} must be a list of {n} ints")
    # msgpack yields exact ints; this refuses floats, bools and strings in one pass.
    _require(all(type(x) is int for x in v), f"{key} holds a non-int")
    try:
        return np.array(v, dtype=_LEN_DTYPE)
    except OverflowError as e:
        raise FrameError(f"{key} holds an int outside int64") from e


def _decode_message(header: dict[str, Any], frames: list[memoryview]) -> Message:
    _check_keys(header, _MESSAGE_HEADER_KEYS, "message header")
    _require(len(frames) == 1, f"message has {len(frames)} frames, expected 1")
    kind, body = header["msg_kind"], header["body"]
    _require(isinstance(kind, str) and bool(kind), "msg_kind must be a non-empty str")
    _require(isinstance(body, dict), "message body must be a map")
    _require(all(isinstance(k, str) for k in body), "message body keys must be str")
    return Message(kind=kind, body=body)


def _decode_arrays(
    header: dict[str, Any], frames: list[memoryview], lens: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Validate the array descriptors against the frames and map them zero-copy.

    The descriptors name the arrays present: the token ids always, then any of
    OPTIONAL_ARRAYS, in spec order.
    """
    descs = header["arrays"]
    _require(isinstance(descs, list), "arrays must be a list of descriptors")
    _require(all(isinstance(d, dict) for d in descs), "array descriptor is not a map")
    present = {d.get("name") for d in descs}
    specs = [s for s in _ARRAY_SPECS if s[0] not in OPTIONAL_ARRAYS or s[0] in present]
    _require(len(descs) == len(specs), f"arrays must list {len(specs)} known descriptors")
    _require(len(frames) == 1 + len(specs), f"got {len(frames)} frames, expected {1 + len(specs)}")
    out: dict[str, np.ndarray] = {}
    for desc, buf, (name, dtype_name, len_key) in zip(descs, frames[1:], specs, strict=True):
        _require(isinstance(desc, dict), "array descriptor is not a map")
        _check_keys(desc, _ARRAY_DESC_KEYS, "array descriptor")
        _require(desc["name"] == name, f"array {desc['name']!r} where {name!r} was expected")
        _require(
            isinstance(desc["dtype"], str) and desc["dtype"] in _WIRE_DTYPES,
            f"array {name}: dtype {desc['dtype']!r} not allowed",
        )
        _require(desc["dtype"] == dtype_name, f"array {name}: dtype must be {dtype_name}")
        count = desc["count"]
        _require(_is_int(count) and count >= 0, f"array {name}: bad count {count!r}")
        dtype = _WIRE_DTYPES[dtype_name]
        _require(
            buf.nbytes == count * dtype.itemsize,
            f"array {name}: {buf.nbytes} bytes for {count} x {dtype_name}",
        )
        _require(
            int(lens[len_key].sum()) == count, f"array {name}: {len_key} does not sum to {count}"
        )
        out[name] = np.frombuffer(buf, dtype=dtype, count=count)
    return out


def _decode_batch(header: dict[str, Any], frames: list[memoryview]) -> EpisodeBatch:
    _check_keys(header, _EPISODE_HEADER_KEYS, "episodes header")
    for key in ("group_size", "policy_version", "seq"):
        _require(_is_int(header[key]), f"{key} must be an int")
    _require(isinstance(header["sampler_id"], str), "sampler_id must be a str")
    stats = header["stats"]
    _require(isinstance(stats, dict), "stats must be a map")
    for k, v in stats.items():
        _require(isinstance(k, str) and _is_real(v), "stats must map str to float")

    rewards = header["reward"]
    _require(isinstance(rewards, list) and len(rewards) > 0, "reward must be a non-empty list")
    n = len(rewards)
    _require(all(type(r) in (int, float) for r in rewards), "reward holds a non-finite number")
    infos, reasons = header["reward_info"], header["finish_reason"]
    _require(isinstance(infos, list) and len(infos) == n, f"reward_info must list {n} maps")
    _require(
        isinstance(reasons, list) and all(isinstance(r, str) for r in reasons),
        f"finish_reason must list {n} strs",
    )
    lens = {key: _int_array(header, key, n) for key in ("prompt_len", "completion_len")}
    group_id = _int_array(header, "group_id", n)
    for key, arr in lens.items():
        # Bounding each length keeps their int64 sum exact (n is far below 2**31).
        _require(bool(((arr >= 0) & (arr < 1 << 31)).all()), f"{key} holds a value < 0 or >= 2**31")
    arrays = _decode_arrays(header, frames, lens)
    try:
        columns = Columns(
            **({name: None for name in OPTIONAL_ARRAYS} | arrays),
            prompt_len=lens["prompt_len"],
            completion_len=lens["completion_len"],
            reward=np.array(rewards, dtype=_REWARD_DTYPE),
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
        raise FrameError(f"undecodable frames: {type(e).__name__}: {e}") from e


def _decode(frames: Sequence[Any], max_frame_bytes: int) -> EpisodeBatch | Message:
    _require(isinstance(frames, Sequence) and not isinstance(frames, (bytes, str)), "bad frames")
    _require(1 <= len(frames) <= _MAX_FRAMES, f"got {len(frames)} frames")
    views = [_as_bytes(f) for f in frames]
    total = sum(v.nbytes for v in views)
    _require(total <= max_frame_bytes, f"message is {total} bytes > limit {max_frame_bytes}")
    _require(views[0].nbytes > _SUM.size, "frame 0 is too short for a checksum")
    (expected,) = _SUM.unpack(views[0][: _SUM.size])
    views[0] = views[0][_SUM.size :]
    got = checksum(views)
    _require(got == expected, f"checksum mismatch ({got:016x}, frame says {expected:016x})")
    header = _unpack_header(views[0], min(MAX_HEADER_BYTES, max_frame_bytes))
    kind = header.get("kind")
    if kind == KIND_EPISODES:
        return _decode_batch(header, views)
    if kind == KIND_MESSAGE:
        return _decode_message(header, views)
    raise FrameError(f"unknown kind {kind!r}")


# --------------------------------------------------------------------------- blobs


def _pad(n: int) -> int:
    return -n % _ALIGN


def frames_to_bytes(frames: Iterable[Any]) -> bytes:
    """Frames as one length-prefixed blob, e.g. to broadcast as a single uint8 tensor.

    Layout: magic, u64 count, u64 length per frame, then the payloads, each padded
    to 8 bytes so that the int32/float32 views made by decode stay aligned.
    """
    views = [_as_bytes(f) for f in frames]
    parts: list[bytes | memoryview] = [_BLOB_MAGIC, _U64.pack(len(views))]
    parts += [_U64.pack(v.nbytes) for v in views]
    for v in views:
        parts += [v, b"\0" * _pad(v.nbytes)]
    return b"".join(parts)


def bytes_to_frames(blob: Any) -> list[memoryview]:
    """Inverse of :func:`frames_to_bytes`; the frames are views into ``blob``.

    Accepts any byte buffer (bytes, bytearray, a uint8 numpy array). Raises FrameError.
    """
    mv = _as_bytes(blob)
    head = len(_BLOB_MAGIC) + _U64.size
    _require(mv.nbytes >= head, f"blob of {mv.nbytes} bytes is too short")
    _require(bytes(mv[: len(_BLOB_MAGIC)]) == _BLOB_MAGIC, "bad blob magic")
    (n,) = _U64.unpack_from(mv, len(_BLOB_MAGIC))
    # Bound n by what the blob can hold before reading the length table.
    _require(n <= (mv.nbytes - head) // _U64.size, f"blob claims {n} frames")
    lengths = [_U64.unpack_from(mv, head + i * _U64.size)[0] for i in range(n)]
    pos = head + n * _U64.size
    _require(
        pos + sum(ln + _pad(ln) for ln in lengths) == mv.nbytes,
        "blob length does not match its frame table",
    )
    out = []
    for ln in lengths:
        out.append(mv[pos : pos + ln])
        pos += ln + _pad(ln)
    return out
