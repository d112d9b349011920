"""A batch's columns: one array per field, concatenated over its episodes, which is also the
wire layout (grpo.wire.codec); what each array is, and the vectorised checks every received
batch goes through."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from grpo.core.tokens import OPTIONAL, TOKEN_FIELDS

FINISH_REASONS = frozenset({"stop", "length"})

# (array name, wire dtype name, which per-episode length it follows), in frame order, and the
# arrays a batch may leave out: read from the per-token fields' table (grpo.core.tokens).
ARRAY_SPECS: tuple[tuple[str, str, str], ...] = tuple(
    (f.name, f.wire, f.follows) for f in TOKEN_FIELDS
)
OPTIONAL_ARRAYS = OPTIONAL
# Wire dtypes are explicit little-endian so sender and receiver agree on any host.
WIRE_DTYPES: dict[str, np.dtype] = {
    "int32": np.dtype("<i4"),
    "float32": np.dtype("<f4"),
    "uint8": np.dtype("u1"),
}
ARRAY_DTYPES = {name: dtype for name, dtype, _ in ARRAY_SPECS}
ARRAYS_BY_LENGTH = {
    lens: tuple(name for name, _, by in ARRAY_SPECS if by == lens)
    for lens in ("prompt_len", "completion_len")
}
LEN_DTYPE = np.dtype(np.int64)  # per-episode lengths and group ids
REWARD_DTYPE = np.dtype(np.float64)
# The largest magnitude a reward or a log-prob may have. Finite in float64 is not enough: the
# trainer computes in float32 (largest 3.4e38), where a reward of 1e39 becomes inf; and a value
# that fits float32 still overflows what is made of it: a group's sum, the differences from its
# mean and their squares (the std, whitening, the k2 KL, the critic's loss), summed over the
# batch's tokens. At 1e12, (2e12)**2 = 4e24 times 2**28 tokens (a message of 1 GiB holds no
# more int32 ids) is about 1e33: finite with room to spare. No reward scale or log-prob a model
# can produce comes near it, so only a bug or a hostile peer is refused.
VALUE_LIMIT = 1e12
# The float arrays bounded by VALUE_LIMIT: the rewards, and the per-token log-probs.
BOUNDED = ("reward", *(f.name for f in TOKEN_FIELDS if f.bounded))
JSON_SCALARS = (str, int, float, bool, type(None))


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
    loss_mask: np.ndarray | None  # uint8 0/1, aligned with completion_ids, or None (all 1)
    teacher_logp: np.ndarray | None  # float32 like old_logp: the teacher's, or None (no teacher)
    # int32 >= 0, aligned with completion_ids: the weights version that sampled each token, none
    # older than the batch's policy_version (check_token_versions); None: all of that version.
    token_versions: np.ndarray | None
    prompt_len: np.ndarray  # int64 [N]
    completion_len: np.ndarray  # int64 [N]
    reward: np.ndarray  # float64 [N]
    group_id: np.ndarray  # int64 [N]
    reward_info: tuple[dict[str, Any], ...]
    finish_reason: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.reward)


# --------------------------------------------------------------------------- checks


def is_int(x: object) -> bool:
    # bool is an int subclass, but True is never a sensible count or id.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_finite_real(x: object) -> bool:
    """A real number (not a bool) that float() takes and that is neither NaN nor infinite."""
    if not is_real(x):
        return False
    try:
        return math.isfinite(x)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond float's range
        return False


def check_1d(arr: object, kinds: str, what: str) -> int:
    """Length of ``arr`` if it is a 1-D array of a dtype kind in ``kinds``."""
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{what} must be a numpy array, got {type(arr).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in kinds:
        raise ValueError(f"{what} has dtype {arr.dtype}, expected kind in {kinds!r}")
    return arr.shape[0]


def check_bounded(values: np.ndarray | None, what: str) -> None:
    """``values`` finite and within +-VALUE_LIMIT (see there), when present."""
    if values is None or not values.size:
        return
    bad = ~(np.abs(values) <= VALUE_LIMIT)  # NaN compares False: caught with inf and the huge
    if bad.any():
        first = values[np.flatnonzero(bad)[0]].item()
        raise ValueError(
            f"{what} holds {first!r}: not a finite number within +-{VALUE_LIMIT:g} (what the "
            "trainer's float32 arithmetic takes)"
        )


def check_columns(c: Columns) -> None:
    """Vectorised checks of a batch's columns: cheap enough for every received batch."""
    n = len(c.reward)
    for name, dtype, shape in (
        ("prompt_len", LEN_DTYPE, (n,)),
        ("completion_len", LEN_DTYPE, (n,)),
        ("group_id", LEN_DTYPE, (n,)),
        ("reward", REWARD_DTYPE, (n,)),
    ):
        arr = getattr(c, name)
        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
            raise ValueError(f"{name} must be a {dtype} array of shape {shape}")
    for lens_name, names in ARRAYS_BY_LENGTH.items():
        lens = getattr(c, lens_name)
        # An answer may be empty; a prompt may not: the forwards predict the first answer
        # token from the last prompt token.
        least = 1 if lens_name == "prompt_len" else 0
        if n and int(lens.min()) < least:
            raise ValueError(f"{lens_name} holds {int(lens.min())}, below {least}")
        total = int(lens.sum())
        for name in names:
            arr = getattr(c, name)
            if arr is None and name in OPTIONAL_ARRAYS:
                continue
            dtype = WIRE_DTYPES[ARRAY_DTYPES[name]]
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 1:
                raise ValueError(f"{name} must be a 1-D {dtype} array")
            if arr.shape[0] != total:
                raise ValueError(f"{name}: {lens_name} does not sum to its {arr.shape[0]} values")
    for name in BOUNDED:
        check_bounded(getattr(c, name), name)
    for field in TOKEN_FIELDS:  # an integer field's range: a negative token id indexes the
        # embedding from its end on the CPU and asserts on a GPU (the trainer's admission
        # checks the other end, its vocabulary); a version below 0; a mask other than 0/1
        values = getattr(c, field.name)
        if values is None or not values.size:
            continue
        if field.low is not None and (least := int(values.min())) < field.low:
            raise ValueError(f"{field.name} holds {least}, below {field.low}")
        if field.high is not None and (most := int(values.max())) > field.high:
            raise ValueError(f"{field.name} holds {most}, above {field.high}")
    if len(c.finish_reason) != n or not FINISH_REASONS.issuperset(c.finish_reason):
        raise ValueError(f"finish_reason must list {n} of {sorted(FINISH_REASONS)}")
    if len(c.reward_info) != n:
        raise ValueError(f"reward_info must list {n} maps")
    if not _plain_infos(c.reward_info):  # the common case, checked in C; else say what is wrong
        for info in c.reward_info:
            if not isinstance(info, dict):
                raise ValueError("reward_info entry is not a map")
            for k, v in info.items():
                if not isinstance(k, str) or not isinstance(v, JSON_SCALARS):
                    raise ValueError(f"reward_info[{k!r}] is not a str key with a JSON scalar")


def oldest_token_versions(c: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(the indices of the answers with at least one token, the version of each one's oldest
    token), from checked columns that have token_versions."""
    assert c.token_versions is not None
    lens = c.completion_len
    answers = np.flatnonzero(lens > 0)
    if not answers.size:
        return answers, np.zeros(0, c.token_versions.dtype)
    # Each segment runs from one non-empty answer's start to the next's: exactly its tokens
    # (the empty answers between them hold none).
    starts = (np.cumsum(lens) - lens)[answers]
    return answers, np.minimum.reduceat(c.token_versions, starts)


def check_token_versions(c: Columns, policy_version: int) -> None:
    """No answer's token older than the batch's policy_version: a batch claims the version of
    its oldest token (the staleness the trainer reports and bounds), so a token older than the
    claim is a batch staler than it says."""
    if c.token_versions is None:
        return
    answers, oldest = oldest_token_versions(c)
    bad = np.flatnonzero(oldest < policy_version)
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"answer {int(answers[i])} has a token of version {int(oldest[i])}, older than the "
            f"batch's policy_version {policy_version} (the version of its oldest token)"
        )


_PLAIN_SCALARS = frozenset(JSON_SCALARS)


def _plain_infos(infos: Sequence[Any]) -> bool:
    """Whether every entry is a dict of str keys to scalars of exactly the JSON types (what
    a decoded frame holds), without a Python-level loop per entry."""
    if set(map(type, infos)) - {dict}:
        return False
    keys = chain.from_iterable(infos)
    values = chain.from_iterable(map(dict.values, infos))
    return set(map(type, keys)) <= {str} and set(map(type, values)) <= _PLAIN_SCALARS


def plain_scalar(v: Any, where: str) -> Any:
    """``v`` as a JSON-able Python scalar (numpy scalars unwrapped), else ValueError."""
    if isinstance(v, np.generic):
        v = v.item()
    if not isinstance(v, JSON_SCALARS):
        raise ValueError(f"{where} must be a JSON scalar, got {type(v).__name__}")
    return v


def plain_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    out = {}
    for k, v in info.items():
        if not isinstance(k, str):
            raise ValueError(f"episodes[{i}].reward_info key {k!r} is not a str")
        out[k] = plain_scalar(v, f"episodes[{i}].reward_info[{k!r}]")
    return out
