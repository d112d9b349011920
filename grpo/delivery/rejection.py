"""A rejection only the batch's sender can read.

The trainer's control channel is a PUB socket: every subscriber hears every message, and a
subscriber needs no key to listen when the run has no CURVE. A rejection's reason says what a
batch must look like ("it has 2 groups of 2", "its vocabulary is ..."), so published in the
clear it taught any listener the shape a forged batch needs (issue 62, finding 2). The
reason is sealed under a key only the batch's sender and the trainer hold: a hash of the
batch's own frames, which the sampler keeps in its spool. Another peer learns that some batch
of that seq was refused, not why, and cannot make a rejection that stops a sampler for a
batch it did not send.

The seal: key = BLAKE2b-256 of the frames, each prefixed by its length; a 16-byte tag
(BLAKE2b keyed by the key) names the batch; the reason is XORed with SHAKE-256 of the key.
One key seals one reason (a batch is refused once per trainer incarnation, with one reason
for the same frames), so the pad is never reused on two texts."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

from grpo.wire.codec import as_bytes

MAX_REASON_BYTES = 1000  # a reason is one line; the tail of a longer one is cut
_TAG_BYTES = 16


def batch_key(frames: Sequence[Any]) -> bytes:
    """What only the batch's sender (and the trainer that received it) can compute."""
    h = hashlib.blake2b(digest_size=32, person=b"grpo-rejected")
    for frame in frames:
        view = as_bytes(frame)
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.digest()


def _tag(key: bytes) -> bytes:
    return hashlib.blake2b(b"tag", key=key, digest_size=_TAG_BYTES).digest()


def _xor_pad(key: bytes, data: bytes) -> bytes:
    pad = hashlib.shake_256(key + b"reason").digest(len(data))
    return bytes(a ^ b for a, b in zip(data, pad, strict=True))


def seal(frames: Sequence[Any], reason: str) -> dict[str, bytes]:
    """The fields of a rejection of the batch sent as `frames`."""
    key = batch_key(frames)
    text = reason.encode("utf-8")[:MAX_REASON_BYTES]
    return {"tag": _tag(key), "sealed": _xor_pad(key, text)}


def unseal(frames: Sequence[Any], body: dict[str, Any]) -> str | None:
    """The reason, when the rejection in `body` is of the batch sent as `frames`; None when
    it is of another batch (another peer's, sent under the same sampler id and seq) or is
    not a sealed rejection at all."""
    tag, sealed = body.get("tag"), body.get("sealed")
    if not isinstance(tag, bytes) or not isinstance(sealed, bytes):
        return None
    if len(sealed) > MAX_REASON_BYTES:
        return None
    key = batch_key(frames)
    if not hmac.compare_digest(tag, _tag(key)):
        return None
    return _xor_pad(key, sealed).decode("utf-8", errors="replace")
