"""Serving streamed versions from memory (weights.mode: stream): the trainer's versions, and a
relaying sampler's, over one ROUTER socket each.

    receiver DEALER ── wmanifest {version} ──────────────────▶ ROUTER (trainer or relay)
                    ◀── [b"M", manifest | missing]
                    ── wbucket {version, base, index} ───────▶  (several in flight)
                    ◀── [b"B" + index, bucket frames] | [b"M" + index, missing]

What is served comes from a `VersionSource`: the trainer's `VersionStore` (the versions it keeps,
each bucket encoded once per base and shared by every receiver asking with that base), or a relay's
(grpo.weights.stream.relay), which may hold a bucket back until it has it: the request is
parked, not refused, until PARK_S pass with no bucket coming into the source (a relay still
receiving keeps its children waiting; a stuck one lets them go to their next source). Like
the file server, the loop answers every request on its own and survives any: a malformed one
is dropped and counted.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from grpo.weights.stream.frames import FULL_COPY, Manifest
from grpo.weights.stream.image import Image, encode_image_bucket
from grpo.wire import messages
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.transport")

MANIFEST, BUCKET = "wmanifest", "wbucket"
BUCKET_TAG, MESSAGE_TAG = b"B", b"M"
INDEX = struct.Struct("<q")
PENDING = object()  # a VersionSource's answer: not yet, ask again soon
PARK_S = 2.0
MAX_REQUEST_BYTES = 1 << 16
NO_BASE = "no such base"  # MISSING's reason when the receiver's base is not kept: ask full


class VersionSource(Protocol):
    progress: int  # buckets taken in so far: parked requests wait while it moves

    def manifest(self, version: int, newer: bool = False) -> Manifest | None | object:
        """Version `version`'s manifest (`newer`: or of the newest version after it), None
        (cannot serve it) or PENDING."""
        ...

    def bucket(self, version: int, base: int, index: int) -> list[Any] | None | object:
        """The bucket's frames, None (cannot serve it) or PENDING. With a base it does not hold,
        a source answers NO_BASE by raising KeyError."""
        ...


class TokenBucket:
    """A sender's link limited to `rate` bytes a second (benchmarks; weights.max_egress_mb_s)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate, self.clock = rate, clock
        self.at, self.tokens = clock(), 0.0

    def take(self, n: int) -> None:
        now = self.clock()
        self.tokens = min(self.tokens + (now - self.at) * self.rate, self.rate * 0.05)
        self.at = now
        self.tokens -= n
        if self.tokens < 0:
            time.sleep(-self.tokens / self.rate)


@dataclass
class VersionStore:
    """The trainer's published versions in host memory: the newest `protected` always (those a
    sampler may still ask for), older ones as delta bases while within `keep` versions and
    `budget_bytes`. Thread-safe: the trainer adds, the serving thread reads."""

    keep: int
    budget_bytes: int
    delta: bool = True
    protected: int = 1
    images: OrderedDict[int, Image] = field(default_factory=OrderedDict)
    _cache: dict[tuple[int, int, int], list[Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    progress = 0  # everything served is here already: nothing is ever parked

    def add(self, image: Image) -> None:
        with self._lock:
            self.images.pop(image.version, None)  # a resumed run republishes a version
            self.images[image.version] = image
            self._cache.clear()  # encodings of the version before, which nobody asks any more
            while len(self.images) > max(self.protected, 1) and (
                len(self.images) > self.keep or self._bytes() > self.budget_bytes
            ):
                self.images.popitem(last=False)

    def _bytes(self) -> int:
        return sum(image.manifest.nbytes for image in self.images.values())

    def identities(self) -> dict[str, str]:
        """Version (a string, for the wire) -> its manifest's identity, for each version held."""
        with self._lock:
            return {str(v): image.manifest.identity for v, image in self.images.items()}

    def images_before(self, version: int) -> list[Image]:
        """The versions held older than `version`, version 0 (the samplers' own) left out."""
        with self._lock:
            return [image for v, image in self.images.items() if 0 < v < version]

    def get(self, version: int) -> Image | None:
        with self._lock:
            return self.images.get(version)

    @property
    def newest(self) -> Image | None:
        with self._lock:
            return next(reversed(self.images.values()), None)

    def manifest(self, version: int, newer: bool = False) -> Manifest | None:
        with self._lock:
            image = self.images.get(version)
            newest = next(reversed(self.images.values()), None)
        if newer and newest is not None and newest.version > version:
            image = newest
        return image.manifest if image is not None else None

    def bucket(self, version: int, base: int, index: int) -> list[Any] | None:
        with self._lock:
            image, old = self.images.get(version), self.images.get(base)
            cached = self._cache.get((version, base, index))
        if image is None or not 0 <= index < len(image.manifest.buckets):
            return None
        if base != FULL_COPY and old is None:
            raise KeyError(NO_BASE)
        if cached is None:
            cached, _ = encode_image_bucket(image, index, old, self.delta)
            with self._lock:
                if self.images.get(version) is image:
                    self._cache[(version, base, index)] = cached
        return cached


@dataclass
class Egress:
    """What a server sent: bytes and buckets per version, refusals."""

    bytes: dict[int, int] = field(default_factory=dict)
    buckets: int = 0
    refused: int = 0


def _request(frames: list[bytes]) -> Message | None:
    try:
        request = decode(frames, max_frame_bytes=MAX_REQUEST_BYTES)
    except FrameError:
        return None
    return request if isinstance(request, Message) else None


def _tag(request: Message) -> bytes:
    """A refusal's first frame: for a bucket, with its index (a receiver takes an answer
    without one for a stale one, and would wait out its timeout for the bucket)."""
    index = request.body.get("index")
    if request.kind == BUCKET and type(index) is int:
        return MESSAGE_TAG + INDEX.pack(index)
    return MESSAGE_TAG


def _missing(reason: str, **body: Any) -> list[Any]:
    return encode_message(Message(messages.MISSING, {"reason": reason, **body}))


class StreamServer:
    """Answers manifest and bucket requests from `source` until `closing`; `failed(cause)` if
    the loop ends any other way."""

    def __init__(
        self,
        router: zmq.Socket,
        source: VersionSource,
        closing: threading.Event,
        failed: Callable[[str], None],
        limiter: TokenBucket | None = None,
    ):
        self.router, self.source, self.closing, self.failed = router, source, closing, failed
        self.limiter = limiter
        self.egress = Egress()
        self.parked: list[tuple[float, bytes, Message]] = []
        self._progress = source.progress
        self._said: tuple[Manifest, list[Any]] | None = None  # the last manifest, encoded

    def run(self) -> None:
        try:
            while not self.closing.is_set():
                if self.router.poll(timeout=5 if self.parked else 200):
                    identity, *frames = self.router.recv_multipart()
                    request = _request(frames)
                    if request is None:
                        self.egress.refused += 1
                    else:
                        self._answer(identity, request, time.monotonic() + PARK_S)
                self._retry_parked()
        except zmq.ZMQError as e:
            if not self.closing.is_set():
                self.failed(f"the weights server failed: ZMQError: {e}")
        except Exception as e:
            log.exception("the weights server failed")
            self.failed(f"the weights server failed: {type(e).__name__}: {e}")
        finally:
            self.router.close()

    def _retry_parked(self) -> None:
        parked, self.parked = self.parked, []
        if parked and self.source.progress != self._progress:  # still coming: wait on
            deadline = time.monotonic() + PARK_S
            parked = [(deadline, identity, request) for _, identity, request in parked]
        self._progress = self.source.progress
        for deadline, identity, request in parked:
            self._answer(identity, request, deadline)

    def _answer(self, identity: bytes, request: Message, deadline: float) -> None:
        reply = self._reply(request)
        if reply is PENDING:
            if time.monotonic() < deadline:
                self.parked.append((deadline, identity, request))
                return
            reply = [_tag(request), *_missing("not here yet", **request.body)]
        assert isinstance(reply, list)
        size = sum(memoryview(f).nbytes for f in reply)
        if self.limiter is not None:
            self.limiter.take(size)
        if reply[0][:1] == BUCKET_TAG:
            version = request.body["version"]
            self.egress.bytes[version] = self.egress.bytes.get(version, 0) + size
            self.egress.buckets += 1
        self.router.send_multipart([identity, *reply], copy=False)

    def _reply(self, request: Message) -> list[Any] | object:
        body = request.body
        version, base, index = body.get("version"), body.get("base", FULL_COPY), body.get("index")
        if type(version) is not int or type(base) is not int:
            self.egress.refused += 1
            return [MESSAGE_TAG, *_missing("bad request")]
        if request.kind == MANIFEST:
            manifest = self.source.manifest(version, body.get("newer") is True)
            if manifest is PENDING:
                return PENDING
            if not isinstance(manifest, Manifest):
                return [MESSAGE_TAG, *_missing("no such version", version=version)]
            if self._said is None or self._said[0] is not manifest:  # once, for every receiver
                body = encode_message(Message(MANIFEST, manifest.to_body()))
                self._said = (manifest, [MESSAGE_TAG, *body])
            return self._said[1]
        if request.kind != BUCKET or type(index) is not int or index < 0:
            self.egress.refused += 1
            return [MESSAGE_TAG, *_missing("bad request")]
        tag = _tag(request)
        try:
            frames = self.source.bucket(version, base, index)
        except KeyError:
            return [tag, *_missing(NO_BASE, version=version, index=index)]
        if frames is PENDING:
            return PENDING
        if frames is None:
            return [tag, *_missing("no such version", version=version, index=index)]
        assert isinstance(frames, list)
        return [BUCKET_TAG + INDEX.pack(index), *frames]
