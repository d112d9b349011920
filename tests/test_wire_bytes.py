"""The bytes on the wire do not change by accident: a restructuring of the code must leave what
a sampler of the previous release sends and a trainer expects (and back) bit for bit the same.

The digests below are those of the encoding before the layering of issue 28 (commit 16ecf37);
a deliberate change of the format changes them here, with a note in docs/architecture.md.
"""

from __future__ import annotations

import hashlib

import pytest

from grpo.wire import messages
from grpo.wire.blobs import frames_to_bytes
from grpo.wire.codec import Message, encode_batch, encode_message
from tests.test_episode import make_batch

BATCHES = {
    "rollout log-probs": (dict(seed=0), "689f422bd2a7c8fc"),
    "loss masks, no rollout log-probs": (
        dict(seed=1, rollout=False, mask=True),
        "5a4203cc2f0d958f",
    ),
}

MESSAGES = {
    messages.HEARTBEAT: (
        {"alive": True, "version": 3, "acked": [[0, 4], [6, 6]], "consumed": 5, "restarts": 1,
         "incarnation": "0123456789ab"},
        "af6759787a3e78cc",
    ),
    messages.VERSION: ({"version": 4}, "357f746b9a7b0bba"),
    messages.STOP: ({"reason": messages.TRAINER_STOPPED}, "e839f40b7ee2fea9"),
    messages.CHUNK: (
        {"version": 4, "file": "model.safetensors", "offset": 1 << 20},
        "8bbbc896475f15c0",
    ),
}  # fmt: skip


def _digest(frames: list) -> str:
    return hashlib.sha256(frames_to_bytes(frames)).hexdigest()[:16]


@pytest.mark.parametrize("case", list(BATCHES))
def test_a_batch_is_encoded_to_the_same_bytes(case):
    kwargs, expected = BATCHES[case]
    assert _digest(encode_batch(make_batch(**kwargs))) == expected


@pytest.mark.parametrize("kind", list(MESSAGES))
def test_a_control_message_is_encoded_to_the_same_bytes(kind):
    body, expected = MESSAGES[kind]
    assert _digest(encode_message(Message(kind, body))) == expected
