"""Receiving a streamed version (weights.mode: stream) from the first source that can give it:
the nearest relay, then the next one up, then the trainer.

From each source: its manifest, then every bucket still missing, `window` requests in flight,
each decoded into a staging copy (grpo.weights.stream.image.Staging) as it arrives. Nothing
reaches the engine until the whole version is in and matched its checksums. Every way a
transfer goes wrong falls back to something that still works, counted in `SyncStats.fallbacks`
and logged:

    a delta the source cannot make (base not kept) -> that bucket as full copies
    a delta whose result fails its checksum        -> that bucket as full copies
    a corrupt bucket (frame or full-copy checksum) -> asked again as full copies, 3 times at most
    a source silent for timeout_s, or refusing     -> the next source, keeping the buckets in
    a relay slower than RELAY_FLOOR_BYTES_PER_S    -> the same (a trickle resets the silence)

The root of trust is the trainer (`trusted`: the identity of each version it announced over
the channel the sampler authenticates, grpo.weights.stream.frames.Manifest.identity). A manifest
of a version the trainer has not announced, or whose identity is not the announced one, is
refused from any source: a relay forwards versions, it never originates one. Each bucket is
then taken only when it matches the manifest's checksum.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import zmq

from grpo.weights.stream.connections import Connections, SourceFailed
from grpo.weights.stream.frames import FULL_COPY, Bucket, Manifest, decode_bucket
from grpo.weights.stream.image import ApplyError, Image, Staging
from grpo.weights.stream.server import (
    BUCKET,
    BUCKET_TAG,
    INDEX,
    MANIFEST,
    MAX_REQUEST_BYTES,
    NO_BASE,
)
from grpo.wire import messages
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.transport")

MAX_CORRUPT = 3
MANIFEST_BYTES = 64 << 20  # the largest manifest taken: about half a million tensors
HEADER_BYTES_PER_TENSOR = 1100  # a bucket header's entry: a name of up to 1024 characters
# A relay gets timeout_s plus a version's bytes at this rate to send it whole: one answering a
# bucket just within timeout_s each time was never passed over (a 1.5 GB model in the default
# 64 MiB buckets: 24 x timeout_s). The trainer, the last source, has no floor: nothing comes
# after it.
RELAY_FLOOR_BYTES_PER_S = 8 << 20


def largest_frame(manifest: Manifest) -> int:
    """The largest frame a bucket of `manifest` can arrive in: a bucket's payload (its tensors'
    encodings; a delta is sent only when smaller than the tensor) or its header. The bucket
    socket refuses a larger one before buffering it (ZMQ_MAXMSGSIZE): a source cannot make
    this receiver hold more than the version it announced."""
    payload = max(manifest.bucket_nbytes, default=0)
    per_bucket = max((end - start for start, end in manifest.buckets), default=0)
    return max(payload, HEADER_BYTES_PER_TENSOR * per_bucket + 1024)


def check_announced(
    manifest: Manifest, trusted: Callable[[], Mapping[int, str]], timeout_s: float
) -> None:
    """SourceFailed unless the trainer announced `manifest`'s version with its identity
    (`trusted()`: version -> identity). A version past the newest announced may be on its way
    in the next heartbeat: waited for, timeout_s at most."""
    v, since = manifest.version, time.monotonic()
    while (want := (known := trusted()).get(v)) is None:
        if (known and max(known) > v) or time.monotonic() - since > timeout_s:
            raise SourceFailed(f"it offers version {v}, which the trainer has not announced")
        time.sleep(0.05)
    if manifest.identity != want:
        raise SourceFailed(
            f"its manifest of version {v} is not the one the trainer announced (identity "
            f"{manifest.identity[:12]}..., announced {want[:12]}...)"
        )


@dataclass
class SyncStats:
    """One receiver's counts over a run: bytes in, versions, and every fallback by its cause."""

    bytes: int = 0
    versions: int = 0
    seconds: float = 0.0
    fallbacks: Counter[str] = field(default_factory=Counter)
    progress: int = 0  # buckets in: a transfer whose count stands still is a named stall

    def fell_back(self, why: str, detail: str) -> None:
        self.fallbacks[why] += 1
        log.warning("weights: %s (%s); falling back", why, detail)


# What a receiver calls with each bucket it took in (a relay passes them on).
BucketSink = Callable[[int, list[Any], Bucket], None]


class VersionFetcher:
    """Takes versions from sources over DEALER sockets (grpo.weights.stream.connections: new
    for each attempt at a source; with `reuse`, kept from a version received whole for the
    next, its owner calling close() from the thread that receives)."""

    def __init__(
        self,
        ctx: zmq.Context,
        secure: Callable[[zmq.Socket, str], None] | None,
        max_bytes: int,
        timeout_s: float,
        window: int = 4,
        delta: bool = True,
        trusted: Callable[[], Mapping[int, str]] | None = None,
        reuse: bool = False,
    ):
        """`trusted()`: version -> the identity the trainer announced for it (None: every
        manifest is taken on its source's word, as from the trainer itself: tests, benchmarks)."""
        self.max_bytes, self.timeout_s, self.window = max_bytes, timeout_s, window
        self.delta, self.trusted = delta, trusted
        self.connections = Connections(ctx, secure, window, reuse)
        self.stats = SyncStats()
        self.source = ""  # where the last version came from
        self.passed_over: list[str] = []  # the sources that failed it

    def receive(
        self,
        sources: Sequence[str],
        version: int,
        held: Image | None,
        sink: BucketSink | None = None,
        staged: Callable[[Staging], None] | None = None,
        newer: bool = False,
    ) -> Image:
        """Version `version` (`newer`: or the newest a source has after it), complete and
        checked; ValueError naming each source's failure. `held`: the version this receiver
        has (the delta base). `staged(staging)` is called once the manifest is known, `sink`
        with each bucket taken in."""
        t0, staging, failures = time.monotonic(), None, []
        self.passed_over = []
        known = held.manifest if held is not None else None
        for addr in sources:
            attempt = self.connections.attempt(addr)
            try:
                sock = attempt.socket(MANIFEST_BYTES)
                self._ask(sock, MANIFEST, version=version, newer=newer)
                asked: dict[int, int] = {}
                if held is not None and staging is None and not newer:
                    ahead = largest_frame(held.manifest)
                    asked = self._ask_ahead(attempt.socket(ahead), version, held)
                manifest = self._manifest(sock, addr, version, newer, known)
                if asked and not manifest.cut_like(held.manifest):
                    attempt.drop(ahead)  # other buckets: the answers on their way are not ours
                    asked = {}
                # the buckets' socket takes no frame larger than they can hold
                sock = attempt.socket(largest_frame(manifest))
                if staging is None or staging.manifest.identity != manifest.identity:
                    staging = Staging(manifest)  # another incarnation's version v: start over
                    if staged is not None:
                        staged(staging)
                base = (
                    held if self.delta and held is not None and held.compatible(manifest) else None
                )
                floor = None
                if addr != sources[-1]:
                    allowed = self.timeout_s + manifest.nbytes / RELAY_FLOOR_BYTES_PER_S
                    floor = time.monotonic() + allowed
                Buckets(self, sock, addr, staging, base, sink, asked, floor).take()
                image = staging.finish()
            except SourceFailed as e:
                attempt.failed()
                failures.append(f"{addr}: {e}")
                self.passed_over.append(addr)
                if addr != sources[-1]:
                    self.stats.fell_back("source failed", failures[-1])
                continue
            except BaseException:
                attempt.failed()
                raise
            attempt.succeeded()
            self.stats.versions += 1
            self.stats.seconds += time.monotonic() - t0
            self.source = addr
            return image
        raise ValueError(f"could not receive version {version}: " + "; ".join(failures))

    def close(self) -> None:
        """Close the sockets kept for the next version."""
        self.connections.close()

    def _ask(self, sock: zmq.Socket, kind: str, **body: Any) -> None:
        sock.send_multipart(encode_message(Message(kind, body)))

    def _recv(
        self, sock: zmq.Socket, addr: str, quiet_since: float, floor: float | None = None
    ) -> list[Any] | None:
        """The next answer on `sock` within 0.1 s, else None; SourceFailed once the source
        was silent for timeout_s, or past `floor` (a relay's time for the whole version)."""
        if floor is not None and time.monotonic() > floor:
            raise SourceFailed(
                f"slower than {RELAY_FLOOR_BYTES_PER_S >> 20} MiB/s, the floor a relay keeps to"
            )
        if sock.poll(timeout=100):
            return sock.recv_multipart(copy=False)
        if time.monotonic() - quiet_since > self.timeout_s:
            raise SourceFailed(f"nothing for {self.timeout_s:g} s (weights.transfer_timeout_s)")
        return None

    def _ask_ahead(self, sock: zmq.Socket, version: int, held: Image) -> dict[int, int]:
        """The first buckets of `version` asked for on `sock` before its manifest is in, as the
        held version tiles them (a version of the same model: the same tensors, the same
        buckets), saving a round trip; their answers are read only once the manifest is checked,
        and only if it tiles them so. Returns the requests: bucket index -> base asked from."""
        base = held.version if self.delta else FULL_COPY
        asked = {}
        for index in range(min(self.window, len(held.manifest.buckets))):
            self._ask(sock, BUCKET, version=version, base=base, index=index)
            asked[index] = base
        return asked

    def _manifest(
        self, sock: zmq.Socket, addr: str, version: int, newer: bool, known: Manifest | None
    ) -> Manifest:
        """The answer to the manifest request sent on `sock`, checked."""
        since = time.monotonic()
        while (frames := self._recv(sock, addr, since)) is None:
            pass
        try:
            reply = decode(frames[1:], max_frame_bytes=MAX_REQUEST_BYTES + self.max_bytes)
            if not isinstance(reply, Message) or reply.kind not in (MANIFEST, messages.MISSING):
                raise FrameError("not a manifest")
            if reply.kind == messages.MISSING:
                raise SourceFailed(f"it has no version {version}: {reply.body.get('reason')}")
            manifest = Manifest.from_body(reply.body, self.max_bytes, known)
        except FrameError as e:
            raise SourceFailed(f"a bad manifest: {e}") from None
        if manifest.version < version or (manifest.version > version and not newer):
            raise SourceFailed(f"it sent the manifest of version {manifest.version}")
        if self.trusted is not None:
            check_announced(manifest, self.trusted, self.timeout_s)
        return manifest


class Buckets:
    """One source's answers for every bucket a staging still misses, `window` requests in
    flight (`asked`: those already sent, bucket index -> base asked from; `floor`: when a relay
    must be done). A full copy's digest is computed on a thread of its own while the next
    buckets come in (the digest of a 538 MB version is 0.1 s of a core, its staging copy as
    much again: in the loop they were on the critical path); the bucket is taken, or asked
    again, once that is known."""

    def __init__(
        self,
        rx: VersionFetcher,
        sock: zmq.Socket,
        addr: str,
        staging: Staging,
        base: Image | None,
        sink: BucketSink | None,
        asked: dict[int, int],
        floor: float | None,
    ):
        self.rx, self.sock, self.addr, self.staging, self.base = rx, sock, addr, staging, base
        self.sink, self.asked, self.floor = sink, asked, floor
        self.todo = [i for i in staging.missing() if i not in asked]
        self.full: set[int] = set()  # asked again as full copies
        self.corrupt, self.since = 0, time.monotonic()
        # bucket index -> (its full copy being checked and staged, its frames, the bucket)
        self.checking: dict[int, tuple[Future[None], list[Any], Bucket]] = {}

    def take(self) -> None:
        rx, version = self.rx, self.staging.manifest.version
        with ThreadPoolExecutor(1, thread_name_prefix="bucket-digest") as digests:
            while self.todo or self.asked or self.checking:
                waiting_on_digests = not (self.todo or self.asked)
                self._settle(block=waiting_on_digests)
                if waiting_on_digests:  # that time was ours, not the source's silence
                    self.since = time.monotonic()
                while self.todo and len(self.asked) < rx.window:
                    index = self.todo.pop(0)
                    full = self.base is None or index in self.full
                    want = FULL_COPY if full else self.base.version
                    rx._ask(self.sock, BUCKET, version=version, base=want, index=index)
                    self.asked[index] = want
                if (
                    self.asked
                    and (frames := rx._recv(self.sock, self.addr, self.since, self.floor))
                    is not None
                ):
                    self._answer(frames, digests)

    def _answer(self, frames: list[Any], digests: ThreadPoolExecutor) -> None:
        tag = frames[0].bytes
        index = INDEX.unpack(tag[1:])[0] if len(tag) == 1 + INDEX.size else None
        if index not in self.asked:
            return  # an answer to a request given up on: never taken
        self.since = time.monotonic()
        wanted = self.asked.pop(index)
        if tag[:1] != BUCKET_TAG:
            self._refused(frames, index)
            return
        bucket = None
        try:
            bucket = decode_bucket(frames[1:], self.rx.max_bytes)
            if bucket.base not in (wanted, FULL_COPY):  # never what was asked: give up on it
                raise SourceFailed(
                    f"bucket {index} came as a delta from version "
                    f"{bucket.base}, asked from {wanted}"
                )
            if bucket.base == FULL_COPY:  # checked on the thread while the next ones come in
                self.checking[index] = (digests.submit(self.staging.apply, bucket, None), frames,
                                        bucket)  # fmt: skip
                return
            self.staging.apply(bucket, self.base)
        except (FrameError, ApplyError) as e:
            self._failed(index, bucket, e)
            return
        self._took(index, frames, bucket)

    def _settle(self, block: bool) -> None:
        """Take or ask again each full copy whose check ended (`block`: wait for one)."""
        if block:
            wait([c[0] for c in self.checking.values()], return_when=FIRST_COMPLETED)
        for index in [i for i, c in self.checking.items() if c[0].done()]:
            staged, frames, bucket = self.checking.pop(index)
            try:
                staged.result()
            except ApplyError as e:
                self._failed(index, bucket, e)
                continue
            self._took(index, frames, bucket)

    def _failed(self, index: int, bucket: Bucket | None, e: Exception) -> None:
        # a delta not decoding to its checksum: a wrong base, asked as full copies;
        # frames or full copies failing theirs: asked again, MAX_CORRUPT times at most
        stats = self.rx.stats
        if bucket is not None and bucket.base != FULL_COPY:
            stats.fell_back("delta mismatch", f"{self.addr}: {e}")
        else:
            self.corrupt += 1
            if self.corrupt > MAX_CORRUPT:
                raise SourceFailed(
                    f"{self.corrupt} buckets fail their checksums, the last: {e}"
                ) from None
            stats.fell_back("corrupt bucket", f"{self.addr}, bucket {index}: {e}")
        self.full.add(index)
        self.todo.append(index)

    def _took(self, index: int, frames: list[Any], bucket: Bucket) -> None:
        self.rx.stats.bytes += sum(f.buffer.nbytes for f in frames)
        self.rx.stats.progress += 1
        if self.sink is not None:
            self.sink(index, frames[1:], bucket)

    def _refused(self, frames: list[Any], index: int) -> None:
        try:
            reply = decode(frames[1:], max_frame_bytes=MAX_REQUEST_BYTES)
        except FrameError as e:
            raise SourceFailed(f"a malformed answer: {e}") from None
        reason = reply.body.get("reason") if isinstance(reply, Message) else None
        if reason == NO_BASE and index not in self.full:
            self.rx.stats.fell_back("base not kept", f"bucket {index}")
            self.full.add(index)
            self.todo.append(index)
            return
        raise SourceFailed(f"bucket {index}: {reason}")
