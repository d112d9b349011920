"""Fuzz tests of every decoder and request handler a peer or a file can reach (issue 29, item
8): whatever bytes come in, the answer is a value or a typed refusal (the one exception type
its caller catches and logs), never another exception that would end a thread or the process.

- grpo.wire.codec.decode: random frames, and valid batches and messages mutated (bytes
  flipped, frames cut, dropped, added or repeated), as they are and sealed again (a valid
  checksum, so the decoder's own checks judge them). Refusal: FrameError, raised by a check
  (UncheckedFrameError means no check caught it). tests/test_episode.py fuzzes the header's
  fields one by one, 10,000 times; these are the frame-level mutations, briefly.
- grpo.reward_service.protocol: request and reply bodies, and bytes through the codec into
  them. Refusal: ValueError.
- grpo.weights.files._reply, the weight server's answer to one request: always a
  Message that can be sent.
- grpo.config.load_config from YAML text: a Config or ConfigError.

Example counts are kept small (the file runs in seconds); derandomized, so a run repeats.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo.config import Config, ConfigError, load_config
from grpo.reward_service import protocol
from grpo.weights.dirs import VERSION_MARKER, version_dir
from grpo.weights.files import CHUNK_BYTES, _reply
from grpo.wire import messages
from grpo.wire.codec import (
    FrameError,
    Message,
    UncheckedFrameError,
    decode,
    encode_batch,
    encode_message,
    seal,
)
from tests.test_episode import _MSGPACK_VALUES, assert_valid_batch, make_batch, received

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,  # reproducible, and no .hypothesis/ left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --------------------------------------------------------------------------- the codec

GOOD = {
    "batch": received(encode_batch(make_batch(seed=1))),
    "masked batch": received(encode_batch(make_batch(seed=2, rollout=False, mask=True))),
    # continuous generation's: each token's version (int32, the last array frame)
    "versioned batch": received(encode_batch(make_batch(seed=3, versions=True))),
    "message": received(encode_message(Message("heartbeat", {"version": 3, "acked": [1, 2]}))),
}


def decoded(frames: list[bytes]) -> Any:
    """decode's value, or None when one of its checks refused the frames; any other outcome
    fails the test."""
    try:
        out = decode(frames, max_frame_bytes=1 << 20)
    except UncheckedFrameError as e:
        raise AssertionError(f"refused by no check: {e}") from e
    except FrameError:
        return None
    if not isinstance(out, Message):
        assert_valid_batch(out)
    return out


def resealed(frames: list[bytes]) -> list[bytes]:
    """The frames with frame 0's checksum made right again (frame 0 without its first 8
    bytes is the header)."""
    if not frames:
        return frames
    return received(seal(frames[0][8:], frames[1:]))


# One mutation of a list of frames: (what, which frame, where, a value).
MUTATION = st.tuples(
    st.sampled_from(["flip", "cut", "drop", "add", "repeat", "grow"]),
    st.integers(0, 1 << 16),
    st.integers(0, 1 << 30),
    st.binary(max_size=32),
)


def mutated(frames: list[bytes], mutations: list[tuple[str, int, int, bytes]]) -> list[bytes]:
    frames = [bytearray(f) for f in frames]
    for what, which, where, value in mutations:
        if not frames:
            frames.append(bytearray(value))
            continue
        i = which % len(frames)
        frame = frames[i]
        if what == "flip" and frame:
            frame[where % len(frame)] ^= 1 << (where % 8)
        elif what == "cut":
            del frame[where % (len(frame) + 1) :]
        elif what == "drop":
            del frames[i]
        elif what == "add":
            frames.insert(i, bytearray(value))
        elif what == "repeat":
            frames.insert(i, bytearray(frame))
        elif what == "grow":
            frame[where % (len(frame) + 1) : where % (len(frame) + 1)] = value
    return [bytes(f) for f in frames]


@FUZZ
@given(st.lists(st.binary(max_size=96), max_size=10))
def test_decode_any_frames(frames: list[bytes]) -> None:
    decoded(frames)
    decoded(resealed(frames))


@FUZZ
@given(st.sampled_from(sorted(GOOD)), st.lists(MUTATION, min_size=1, max_size=4))
def test_decode_mutated_batches_and_messages(name: str, mutations: list) -> None:
    frames = mutated(GOOD[name], mutations)
    out = decoded(frames)
    if out is not None:  # past the checksum: the data must be what was sent
        again = encode_message(out) if isinstance(out, Message) else encode_batch(out)
        assert received(again) == GOOD[name]
    decoded(resealed(frames))


def test_valid_frames_decode() -> None:
    """The fuzz tests' own judge lets the encoder's frames through."""
    for frames in GOOD.values():
        assert decoded(frames) is not None
        assert decoded(resealed(frames)) is not None


# --------------------------------------------------------------------------- reward service

ITEM = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=8) | _MSGPACK_VALUES,
        "answer": st.text(max_size=8) | _MSGPACK_VALUES,
        "reference": st.text(max_size=8) | _MSGPACK_VALUES,
    },
)
REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=8) | _MSGPACK_VALUES,
        "items": st.lists(ITEM | _MSGPACK_VALUES, max_size=5) | _MSGPACK_VALUES,
    },
)
NUMBER = st.integers(-(1 << 70), 1 << 70) | st.floats() | st.booleans() | _MSGPACK_VALUES
REPLY = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=8),
        "rewards": st.lists(NUMBER, max_size=4) | _MSGPACK_VALUES,
        "infos": st.lists(st.dictionaries(st.text(max_size=4), _MSGPACK_VALUES, max_size=2)
                          | _MSGPACK_VALUES, max_size=4) | _MSGPACK_VALUES,
    },
)  # fmt: skip


def parsed_request(body: Any) -> tuple[str, list[protocol.Item]] | None:
    try:
        rid, items = protocol.parse_request(body, max_items=4)
    except ValueError:
        return None
    assert isinstance(rid, str) and rid and 1 <= len(items) <= 4
    assert all(isinstance(v, str) for it in items for v in it.to_json().values())
    return rid, items


def parsed_scores(body: Any, n: int) -> list[tuple[float, dict]] | None:
    try:
        scores = protocol.parse_scores(body, n)
    except ValueError:
        return None
    assert len(scores) == n
    assert all(type(r) is float and isinstance(i, dict) for r, i in scores)
    return scores


@FUZZ
@given(REQUEST | st.dictionaries(st.text(max_size=6), _MSGPACK_VALUES, max_size=4))
def test_reward_requests(body: dict[str, Any]) -> None:
    parsed_request(body)


@FUZZ
@given(REPLY, st.integers(0, 4))
def test_reward_replies(body: dict[str, Any], n: int) -> None:
    parsed_scores(body, n)


@FUZZ
@example({"rewards": [math.nan], "infos": [{}]}, 1)
@given(REPLY, st.integers(0, 4))
def test_reward_replies_hold_finite_rewards(body: dict[str, Any], n: int) -> None:
    """finding 4: a NaN or inf score from the service must be refused where it is parsed."""
    scores = parsed_scores(body, n)
    assert scores is None or all(math.isfinite(r) for r, _ in scores)


@FUZZ
@given(st.sampled_from([protocol.SCORE, protocol.SCORES, protocol.PING]), REQUEST | REPLY,
       st.lists(MUTATION, max_size=3))  # fmt: skip
def test_reward_messages_through_the_codec(kind: str, body: dict, mutations: list) -> None:
    """Bytes off the reward socket: decoded, then parsed as the service and the client do."""
    try:
        frames = received(encode_message(Message(kind, body)))
    except (ValueError, TypeError, OverflowError):  # not even msgpack: nothing a peer sends
        return
    msg = decoded(resealed(mutated(frames, mutations)) if mutations else frames)
    if isinstance(msg, Message):
        parsed_request(msg.body)
        parsed_scores(msg.body, 2)


def _int32s(values: list[int]) -> dict:
    return protocol.pack_array(np.array(values, np.int64), "int32")


ARRAY = (
    st.lists(st.integers(-3, 70), max_size=6).map(_int32s)
    | st.fixed_dictionaries({"dtype": st.sampled_from(["int32", "float32", "int64", 3]),
                             "data": st.binary(max_size=24) | _MSGPACK_VALUES})
    | _MSGPACK_VALUES
)  # fmt: skip
TEACHER_REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(min_size=1, max_size=4) | _MSGPACK_VALUES,
        "temperature": NUMBER,
        "tokenizer": st.dictionaries(st.text(max_size=4), _MSGPACK_VALUES, max_size=2)
        | _MSGPACK_VALUES,
        "prompt_len": ARRAY, "completion_len": ARRAY, "prompt_ids": ARRAY,
        "completion_ids": ARRAY,
    },
)  # fmt: skip


@FUZZ
@given(TEACHER_REQUEST)
def test_teacher_requests(body: dict[str, Any]) -> None:
    """A teacher request (teacher.where: service) is parsed into answers within the limits the
    service runs the teacher on, or refused with ValueError, nothing else."""
    try:
        rid, request = protocol.parse_teacher_request(body, 4, max_tokens=8, vocab_size=64)
    except ValueError:
        return
    assert isinstance(rid, str) and 1 <= len(request.prompts) <= 4
    assert len(request.prompts) == len(request.completions)
    for p, c in zip(request.prompts, request.completions, strict=True):
        assert p.dtype == c.dtype == np.int32 and len(p) >= 1 and len(p) + len(c) <= 8
        assert all(0 <= int(x) < 64 for x in (*p, *c))
    assert math.isfinite(request.temperature) and request.temperature > 0


@FUZZ
@given(ARRAY | st.lists(st.floats(width=32), max_size=6).map(
    lambda v: protocol.pack_array(np.array(v, np.float32), "float32")),
    st.lists(st.integers(0, 3), max_size=3))  # fmt: skip
def test_teacher_replies(logp: Any, lengths: list[int]) -> None:
    """A teacher reply is exactly one finite, bounded float32 per answer token, or refused."""
    try:
        got = protocol.parse_teacher_reply({"id": "r", "logp": logp}, lengths)
    except ValueError:
        return
    assert [len(x) for x in got] == lengths
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in got)


# --------------------------------------------------------------------------- weight server


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A run dir holding one published version (3) of two files."""
    run_dir = tmp_path_factory.mktemp("served")
    vdir = version_dir(run_dir, 3)
    vdir.mkdir(parents=True)
    files = {"model.safetensors": b"w" * 300, "config.json": b"{}"}
    for name, data in files.items():
        (vdir / name).write_bytes(data)
    manifest = {n: {"bytes": len(d), "xxh3": "0"} for n, d in files.items()}
    (vdir / VERSION_MARKER).write_text(json.dumps({"version": 3, "step": 3, "files": manifest}))
    return run_dir


WEIGHT_REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from([3, 2, 0, -1, 1 << 40, 1 << 63]) | _MSGPACK_VALUES,
        "file": st.sampled_from(["model.safetensors", "config.json", VERSION_MARKER, "../x",
                                 "", "/etc/passwd"]) | _MSGPACK_VALUES,
        "offset": st.sampled_from([0, 1, 299, 300, -1, 1 << 62, 1 << 63, 1 << 64 - 1])
        | _MSGPACK_VALUES,
    },
)  # fmt: skip


@FUZZ
@example(messages.CHUNK, {"version": 3, "file": [1], "offset": 0})
@example(messages.CHUNK, {"version": 3, "file": "model.safetensors", "offset": 1 << 63})
@given(st.sampled_from([messages.MANIFEST, messages.CHUNK, messages.MISSING, "x"]),
       WEIGHT_REQUEST)  # fmt: skip
def test_weight_server_replies_to_any_request(served: Path, kind: str, body: dict) -> None:
    """finding 3: one request is answered (or refused with MISSING), and the answer can be
    sent: the serving thread never sees an exception from it."""
    reply = _reply(served, Message(kind, body))
    assert isinstance(reply, Message) and reply.kind in (kind, messages.MISSING)
    encode_message(reply)
    if reply.kind == messages.CHUNK:
        assert isinstance(reply.body["data"], bytes) and len(reply.body["data"]) <= CHUNK_BYTES


# --------------------------------------------------------------------------- config


def leaf_keys(cls: type = Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of the config tree, as its path of names."""
    keys = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            keys += leaf_keys(tp, (*prefix, f.name))
        else:
            keys.append((*prefix, f.name))
    return keys


# Real keys with values of any type: what a hand-edited or generated config file holds.
KEYS = leaf_keys()
YAML_VALUE = (
    _MSGPACK_VALUES
    | st.sampled_from([".nan", ".inf", "-.inf", "1e999", "nan", "0", "-1", "1e-9", "[]", "{}",
                       "~", "'x'", "!!binary aGk=", "*a", "&a 1", "[[[[1]]]]"])
)  # fmt: skip


def loads_or_refuses(text: str | bytes, directory: Path) -> None:
    path = directory / "fuzz.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with contextlib.suppress(ConfigError):  # the typed refusal
        assert isinstance(load_config(path), Config)


@FUZZ
@example("[" * 3000)
@example("train: " + "{a: " * 3000)
@given(st.text(max_size=200))
def test_config_from_any_text(tmp_path_factory, text: str) -> None:
    loads_or_refuses(text, tmp_path_factory.getbasetemp())


@FUZZ
@example(b"train:\n  lr: \xff\n")
@given(st.binary(max_size=100))
def test_config_from_any_bytes(tmp_path_factory, data: bytes) -> None:
    loads_or_refuses(data, tmp_path_factory.getbasetemp())


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS), YAML_VALUE), max_size=4))
def test_config_from_real_keys_with_any_values(tmp_path_factory, entries: list) -> None:
    tree: dict[str, Any] = {}
    for path, value in entries:
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value if isinstance(value, str) else json.dumps(value, default=repr)
    loads_or_refuses(as_yaml(tree), tmp_path_factory.getbasetemp())


def as_yaml(tree: dict[str, Any], indent: str = "") -> str:
    """Nested sections as YAML, the values as they are written (`.nan`, `*a`, `[[1]]`)."""
    return "".join(
        f"{indent}{key}:\n{as_yaml(value, indent + '  ')}" if isinstance(value, dict)
        else f"{indent}{key}: {value}\n"
        for key, value in tree.items()
    )  # fmt: skip
