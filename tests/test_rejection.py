"""A rejection's reason opens only with the frames of the batch it rejects (issue 62, item 3)."""

from __future__ import annotations

import numpy as np

from grpo.delivery import rejection

FRAMES = [b"header", np.arange(6, dtype=np.int32), memoryview(b"payload")]
REASON = "it has 2 groups of 2; the trainer takes 1 group of 2"


def test_the_sender_reads_the_reason() -> None:
    assert rejection.unseal(FRAMES, rejection.seal(FRAMES, REASON)) == REASON


def test_the_sealed_fields_do_not_carry_the_reason() -> None:
    body = rejection.seal(FRAMES, REASON)
    assert set(body) == {"tag", "sealed"}
    assert b"groups" not in body["sealed"] and b"groups" not in body["tag"]


def test_other_frames_do_not_open_it() -> None:
    body = rejection.seal(FRAMES, REASON)
    assert rejection.unseal([b"header", np.arange(6, dtype=np.int32), b"payloaD"], body) is None
    # the same bytes cut into frames elsewhere are another batch: lengths are in the key
    assert rejection.unseal([b"head", b"er", FRAMES[1], FRAMES[2]], body) is None


def test_a_tampered_or_malformed_rejection_does_not_open() -> None:
    body = rejection.seal(FRAMES, REASON)
    flipped = bytes([body["tag"][0] ^ 1]) + body["tag"][1:]
    assert rejection.unseal(FRAMES, {**body, "tag": flipped}) is None
    assert rejection.unseal(FRAMES, {**body, "tag": "not bytes"}) is None
    assert rejection.unseal(FRAMES, {"tag": body["tag"]}) is None
    assert rejection.unseal(FRAMES, {"reason": REASON}) is None
    too_long = {**body, "sealed": bytes(rejection.MAX_REASON_BYTES + 1)}
    assert rejection.unseal(FRAMES, too_long) is None


def test_a_long_reason_is_cut_to_the_bound() -> None:
    body = rejection.seal(FRAMES, "x" * 5000)
    assert len(body["sealed"]) == rejection.MAX_REASON_BYTES
    assert rejection.unseal(FRAMES, body) == "x" * rejection.MAX_REASON_BYTES
