"""Episodes and episode batches: the plain data the sampler produces and the trainer consumes.

An :class:`EpisodeBatch` is stored as columns (grpo.core.columns: one array per field,
concatenated over the batch), which is also its wire layout, so sending it gathers nothing.
Constructors validate every field: a malformed batch raises ValueError before it is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Any

import numpy as np

from grpo.core.columns import (
    ARRAY_DTYPES,
    FINISH_REASONS,
    LEN_DTYPE,
    OPTIONAL_ARRAYS,
    REWARD_DTYPE,
    WIRE_DTYPES,
    Columns,
    check_1d,
    check_columns,
    check_token_versions,
    is_finite_real,
    is_int,
    is_real,
    plain_info,
)
from grpo.core.tokens import ANSWER, PROMPT, TOKEN_FIELDS

# A reward made of parts (format, answer, a judge...) reports each part as
# reward_info["reward/<name>"], the parts summing to the reward: GDPO normalises them apart
# (grpo.algos.advantages.gdpo_advantages). A reward that reports none has one component.
REWARD_COMPONENT_PREFIX = "reward/"


def reward_components(infos: Sequence[dict[str, Any]]) -> tuple[tuple[str, ...], np.ndarray]:
    """The component names any episode reports (sorted) and their values, (N, K) float64; 0
    where an episode lacks one (a reward that failed scored 0, so did each of its parts)."""
    names = sorted({k for info in infos for k in info if k.startswith(REWARD_COMPONENT_PREFIX)})
    values = np.zeros((len(infos), len(names)), np.float64)
    for i, info in enumerate(infos):
        for j, name in enumerate(names):
            value = info.get(name, 0.0)
            if not is_finite_real(value):
                raise ValueError(f"episodes[{i}].reward_info[{name!r}] is {value!r}, not a number")
            values[i, j] = float(value)
    return tuple(n.removeprefix(REWARD_COMPONENT_PREFIX) for n in names), values


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
    # uint8 or bool [C]: 1 on the tokens the model sampled, 0 on a tool's results (a multi-turn
    # answer, grpo.rollout.multi_turn); None: every token is the model's.
    loss_mask: np.ndarray | None = None
    teacher_logp: np.ndarray | None = None  # float32 [C], under the teacher (None: no teacher)
    # int [C] >= 0: the weights version that sampled each token (continuous generation); None:
    # all of them the batch's policy_version.
    token_versions: np.ndarray | None = None


class EpisodeBatch:
    """Whole groups of episodes sampled with one policy version, stored as :class:`Columns`.

    ``policy_version`` is the version of the oldest token: with continuous generation an answer
    may span several versions (``columns.token_versions``), none older than it.

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
        with _naming(seq, sampler_id):
            for i, ep in enumerate(episodes):
                _check_episode(ep, i)
            columns = _gather(episodes)
            # The checks a receiver makes (finite rewards and log-probs...): a sampler never
            # builds, spools and sends a batch that the trainer would refuse.
            check_columns(columns)
            self._init(columns, group_size, policy_version, seq, sampler_id, stats or {})
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
        batch = cls.__new__(cls)
        with _naming(seq, sampler_id):
            check_columns(columns)
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
        check_batch(self)

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
        """A new batch with optional per-token arrays (OPTIONAL_ARRAYS) set from one array per
        episode, e.g. the log-probs the trainer computed itself."""
        unknown = set(per_episode) - set(OPTIONAL_ARRAYS)
        if unknown:
            raise ValueError(f"with_arrays sets only {OPTIONAL_ARRAYS}, not {sorted(unknown)}")
        columns = self.columns
        for name, parts in per_episode.items():
            if len(parts) != len(self):
                raise ValueError(f"{name}: {len(parts)} arrays for {len(self)} episodes")
            wire = WIRE_DTYPES[ARRAY_DTYPES[name]]
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


# --------------------------------------------------------------------------- validation


@contextmanager
def _naming(seq: object, sampler_id: object) -> Iterator[None]:
    """A refusal names the batch and its sender: the one line a receiver logs says whose
    batch was bad and which field (the id as claimed: it is checked after this)."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"batch {seq!r:.20} from {sampler_id!r:.80}: {e}") from None


def _check_episode(ep: object, i: int) -> None:
    """Shape/type checks of one episode; reads only metadata, and the values of an array
    whose cast to its wire dtype could wrap (an int64 version 2**32 would arrive as 0, a
    uint16 mask of 256 as 0)."""
    if not isinstance(ep, Episode):
        raise ValueError(f"episodes[{i}] is {type(ep).__name__}, not Episode")
    n = len(ep.completion_ids) if isinstance(ep.completion_ids, np.ndarray) else None
    for field in TOKEN_FIELDS:
        arr = getattr(ep, field.name)
        if arr is None and field.optional:
            continue
        what = f"episodes[{i}].{field.name}"
        m = check_1d(arr, field.kinds, what)
        if field.follows == ANSWER and field.name != "completion_ids" and m != n:
            raise ValueError(f"{what} has length {m}, completion_ids has {n}")
        if arr.dtype != WIRE_DTYPES[field.wire] and arr.size and field.kinds != "f":
            low, high = int(arr.min()), int(arr.max())
            wire = np.iinfo(WIRE_DTYPES[field.wire])
            least = wire.min if field.low is None else field.low
            most = wire.max if field.high is None else min(field.high, wire.max)
            if low < least or high > most:
                bad = low if low < least else high
                raise ValueError(f"{what} holds {bad}, outside [{least}, {most}]")
    if ep.finish_reason not in FINISH_REASONS:
        raise ValueError(
            f"episodes[{i}].finish_reason={ep.finish_reason!r}, expected one of "
            f"{sorted(FINISH_REASONS)}"
        )
    if not is_int(ep.group_id):
        raise ValueError(f"episodes[{i}].group_id must be an int, got {ep.group_id!r}")
    if not is_real(ep.reward):
        raise ValueError(f"episodes[{i}].reward must be a real number, got {ep.reward!r}")
    if not isinstance(ep.reward_info, dict):
        raise ValueError(f"episodes[{i}].reward_info must be a dict")


def check_batch(batch: EpisodeBatch) -> None:
    g = batch.group_size
    if not is_int(g) or g < 1:
        raise ValueError(f"group_size must be a positive int, got {g!r}")
    n = len(batch.columns)
    if n == 0 or n % g:
        raise ValueError(f"len(episodes)={n} is not a positive multiple of group_size={g}")
    for name in ("policy_version", "seq"):
        if not is_int(getattr(batch, name)):
            raise ValueError(f"{name} must be an int, got {getattr(batch, name)!r}")
    if not isinstance(batch.sampler_id, str):
        raise ValueError(f"sampler_id must be a str, got {batch.sampler_id!r}")
    check_token_versions(batch.columns, batch.policy_version)
    if not isinstance(batch.stats, dict) or not all(
        isinstance(k, str) and is_real(v) for k, v in batch.stats.items()
    ):
        raise ValueError("stats must be a dict[str, float]")
    for key, value in batch.stats.items():
        if not is_finite_real(value):  # every metrics row carries them, as floats
            raise ValueError(f"stats[{key!r:.80}] is {value!r:.40}, not a finite float")
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

    An optional log-prob array (old_logp, ref_logp, rollout_logp, teacher_logp), or
    token_versions, is kept only when every episode has one; otherwise it is dropped for the
    whole batch (the receiver sees None everywhere). The loss mask is kept when any episode has
    one, the others' all ones: a dropped mask would train on a tool's tokens.
    """
    arrays: dict[str, np.ndarray | None] = {}
    for field in TOKEN_FIELDS:
        name, wire = field.name, WIRE_DTYPES[field.wire]
        parts = [getattr(ep, name) for ep in eps]
        if name == "loss_mask" and any(p is not None for p in parts):
            parts = [
                np.ones(len(ep.completion_ids), wire) if p is None else p
                for p, ep in zip(parts, eps, strict=True)
            ]
        if field.optional and any(p is None for p in parts):
            arrays[name] = None
            continue
        # same_kind casting refuses e.g. float -> int, which would be silent garbage.
        # Arrays already in the wire dtype skip the casting path, which is ~10x slower.
        if not parts:
            arrays[name] = np.zeros(0, wire)
        elif all(p.dtype == wire for p in parts):
            arrays[name] = np.concatenate(parts)
        else:
            arrays[name] = np.concatenate(parts, dtype=wire, casting="same_kind")
    return Columns(
        **arrays,
        prompt_len=np.array([len(ep.prompt_ids) for ep in eps], LEN_DTYPE),
        completion_len=np.array([len(ep.completion_ids) for ep in eps], LEN_DTYPE),
        reward=np.array([float(ep.reward) for ep in eps], REWARD_DTYPE),
        group_id=np.array([int(ep.group_id) for ep in eps], LEN_DTYPE),
        reward_info=tuple(plain_info(ep.reward_info, i) for i, ep in enumerate(eps)),
        finish_reason=tuple(ep.finish_reason for ep in eps),
    )


def _offsets(lens: np.ndarray) -> list[int]:
    return [0, *accumulate(lens.tolist())]


def _token_parts(c: Columns, prompts: tuple[int, int], answers: tuple[int, int]) -> dict:
    """Every per-token array of `c` cut to the episodes whose tokens are at [start, stop) of
    the prompts and of the answers, as views."""
    spans = {PROMPT: prompts, ANSWER: answers}
    return {f.name: _part(getattr(c, f.name), *spans[f.follows]) for f in TOKEN_FIELDS}


def _scatter(c: Columns) -> tuple[Episode, ...]:
    """Episodes whose arrays are views of the columns."""
    p, k = _offsets(c.prompt_len), _offsets(c.completion_len)
    rewards, group_ids = c.reward.tolist(), c.group_id.tolist()
    return tuple(
        Episode(
            **_token_parts(c, (p[i], p[i + 1]), (k[i], k[i + 1])),
            reward=rewards[i],
            reward_info=c.reward_info[i],
            finish_reason=c.finish_reason[i],
            group_id=group_ids[i],
        )
        for i in range(len(c))
    )


def _part(arr: np.ndarray | None, start: int, stop: int) -> np.ndarray | None:
    return None if arr is None else arr[start:stop]


def _slice_columns(c: Columns, start: int, stop: int) -> Columns:
    """Episodes ``[start, stop)`` of ``c`` as views."""
    p, k = _offsets(c.prompt_len), _offsets(c.completion_len)
    return Columns(
        **_token_parts(c, (p[start], p[stop]), (k[start], k[stop])),
        prompt_len=c.prompt_len[start:stop],
        completion_len=c.completion_len[start:stop],
        reward=c.reward[start:stop],
        group_id=c.group_id[start:stop],
        reward_info=c.reward_info[start:stop],
        finish_reason=c.finish_reason[start:stop],
    )
