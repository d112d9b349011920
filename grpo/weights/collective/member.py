"""A sampler's end of weights.mode collective: a thread that joins the group the trainer
announces, takes every version broadcast in it, checks each bucket against the manifest's
checksum, and offers the whole version to the sampler's follower (which takes it only once the
trainer announced that manifest's identity, grpo.weights.stream.follower).

Its state travels in the sampler's heartbeats: "ready:G" (not in a group; G the generation it
last left, 0 for none) or "member:G". Any failure (the trainer gone, a peer dead or stalled, a
malformed message) ends its membership: it says it left, and the trainer invites it again. The
follower streams whatever the group will not bring (`expects`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from grpo.config import Config
from grpo.weights.collective import group as wire
from grpo.weights.collective.membership import GroupInfo
from grpo.weights.collective.rendezvous import RemoteStore
from grpo.weights.stream.buffers import BufferPool
from grpo.weights.stream.frames import Manifest, bucket_sum
from grpo.weights.stream.image import Image
from grpo.wire.codec import FrameError
from grpo.wire.unpack import unpack_bounded

log = logging.getLogger("grpo.sampler")


class LeftGroup(RuntimeError):
    """This member cannot follow the group any more (it leaves; the trainer re-invites it)."""


class GroupMember:
    def __init__(
        self,
        cfg: Config,
        sampler_id: str,
        announced: Callable[[], Any],
        offer: Callable[[Image], None],
    ):
        """`announced()`: the group the trainer's heartbeats name (as they say it, checked
        here); `offer(image)`: a version
        received whole, each bucket matching its checksum."""
        w = cfg.weights
        self.sampler_id, self.announced, self.offer = sampler_id, announced, offer
        self.addr, self.timeout_s = w.collective_addr, w.collective_timeout_s
        self.max_version_bytes = cfg.transport.max_version_bytes
        self.epoch = ""  # the trainer process whose generations `left` counts
        self.left = 0  # the last generation this member was in (or failed to join)
        self.state = "ready:0"  # what its heartbeats say
        self.progress = 0  # buckets received: a transfer that stops shows as a stall
        self.received_bytes = 0
        self._first: int | None = None  # in a group: the oldest version it will be sent
        self._last = -1  # the newest version broadcast to it, taken or not
        self._previous: Manifest | None = None  # the last version this generation sent
        self.pool = BufferPool()  # the buckets' host memory
        # checks bucket k while bucket k+1 arrives: gloo and BLAKE3 both let go of the GIL,
        # and a check in line with the wire was a quarter of a full version's broadcast
        self._checker = ThreadPoolExecutor(1, thread_name_prefix="group-check")
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="group-member", daemon=True)
        self._thread.start()

    def expects(self, version: int) -> bool:
        """Whether the group will bring `version`: this sampler is a member, and the version
        is neither older than its membership nor already sent (the group sends them in order;
        one sent and not taken, failing its checksums or never announced, is streamed)."""
        first = self._first
        return first is not None and version >= first and version > self._last

    def _run(self) -> None:
        while not self._closing.is_set():
            info = GroupInfo.from_json(self.announced())
            if info is not None and info.epoch != self.epoch:  # a new trainer: its own count
                self.epoch, self.left = info.epoch, 0
            rank = info.rank(self.sampler_id) if info is not None else None
            if info is None or rank is None or info.generation <= self.left:
                self._closing.wait(0.05)
                continue
            try:
                self._follow(info, rank)
            except (RuntimeError, ValueError) as e:  # gloo's errors are RuntimeErrors
                if not self._closing.is_set():
                    log.warning(
                        "weights: left collective group %d: %s", info.generation, wire.reason(e)
                    )
            finally:
                self._first, self.left = None, info.generation
                self.state = f"ready:{info.generation}"

    def _follow(self, info: GroupInfo, rank: int) -> None:
        """Join generation `info.generation` and take what it sends until it ends."""
        meeting = RemoteStore(self.addr, self.timeout_s)
        interface = wire.local_interface(self.addr)
        try:
            group = wire.form(
                meeting,
                wire.prefix(info.generation, info.key),
                rank,
                len(info.members) + 1,
                interface,
                self.timeout_s,
            )
        finally:
            meeting.close_connection()  # the group's own connections carry the rest
        self.state = f"member:{info.generation}"
        self._previous = None
        log.info("weights: joined collective group %d as rank %d", info.generation, rank)
        while not self._closing.is_set():
            (kind, value, size, _), sums = wire.exchange_header(group, None)
            if kind == wire.KEEPALIVE:
                self._first = value
            elif kind == wire.VERSION:
                self._take(group, self._manifest(group, value, size, sums))
            elif kind == wire.REFORM:
                return
            else:
                raise LeftGroup(f"a header of unknown kind {kind}")

    def _manifest(self, group: object, version: int, size: int, sums: tuple[str, ...]) -> Manifest:
        """Version `version`'s manifest: broadcast after the header (`size` bytes), or, with
        no size, the previous version's with the header's bucket checksums."""
        previous = self._previous
        if size == 0:
            if previous is None or len(sums) != len(previous.sums):
                raise LeftGroup(f"version {version} said to be cut like a version not sent")
            manifest = dataclasses.replace(previous, version=version, sums=sums)
        elif 0 < size <= wire.MAX_MANIFEST_BYTES:
            raw = np.empty(size, np.uint8)
            wire.broadcast(group, raw)
            try:
                body = unpack_bounded(memoryview(raw))
                manifest = Manifest.from_body(body, self.max_version_bytes, previous)
            except (FrameError, ValueError) as e:
                raise LeftGroup(f"version {version}'s manifest: {e}") from None
            if manifest.version != version:
                raise LeftGroup(f"a manifest of version {manifest.version} under {version}")
        else:
            raise LeftGroup(f"version {version}'s manifest of {size} bytes")
        self._previous = manifest
        return manifest

    def _take(self, group: object, manifest: Manifest) -> None:
        """One version's buckets. A bucket that fails its checksum loses the version (the
        follower streams it) but not the group: every bucket is still read."""
        version, flats, sums = manifest.version, {}, []
        for index in range(len(manifest.buckets)):
            # memory an older version no longer holds: gloo took up to 3 times as long to
            # write a fresh 64 MiB buffer, faulting its pages in mid-receive
            data = self.pool.take(manifest.bucket_nbytes[index])
            if data.size:
                wire.broadcast(group, data)
            self.progress += 1
            self.received_bytes += data.size
            sums.append(self._checker.submit(bucket_sum, [data]))
            flats[index] = data
        wrong = [i for i, s in enumerate(sums) if s.result() != manifest.sums[i]]
        self.pool.keep_spare(manifest.nbytes)
        if wrong:
            self._last = version
            log.warning(
                "weights: version %d from the group fails the checksums of buckets %s: "
                "taken by stream instead",
                version,
                wrong[:5],
            )
            return
        log.info(
            "weights: version %d from the collective group (%d bytes)", version, manifest.nbytes
        )
        self.offer(Image(manifest, flats=flats))
        self._last = version  # after the offer: the follower sees it coming or in, never neither

    def close(self) -> None:
        """Stop following (an operation under way ends within weights.collective_timeout_s,
        the thread with the process)."""
        self._closing.set()
        self._thread.join(timeout=1)
        self._checker.shutdown(wait=False)
