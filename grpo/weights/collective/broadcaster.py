"""Trainer rank 0's end of weights.mode collective: each published version broadcast to the
samplers in its group, on a thread of its own, so that no sampler can hold up training.

Who is in the group: the samplers whose heartbeats say they are ready to join ("ready:G",
having left generation G), and the members of the group as it is. A new membership is a new
generation: the members of the old one are told to move (a REFORM header), the trainer
announces the new one in its heartbeats (grpo.weights.collective.membership.GroupInfo) and
waits for every member to join.
When an operation fails (a member died, or stalled past weights.collective_timeout_s, or the
broadcaster's own code raised: logged with its traceback, the thread lives on) the group
is dropped at once, and each of its members is invited again only once it says it left that
generation: a dead one never does. Until then, and for any version sent before a sampler
joined, versions go by stream from the same store, which is also the catch-up path.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
import numpy as np

from grpo.config import Config
from grpo.weights.collective import group as wire
from grpo.weights.collective.membership import KEY_CHARS, GroupInfo, invited
from grpo.weights.collective.rendezvous import Rendezvous
from grpo.weights.stream.frames import Manifest
from grpo.weights.stream.server import VersionStore

log = logging.getLogger("grpo.trainer")

CLOSE = -1  # the queue's last item


class Broadcaster:
    def __init__(
        self,
        cfg: Config,
        store: VersionStore,
        states: Callable[[], Mapping[str, tuple[str, str]]],
        published: int = 0,
    ):
        """`states()`: each live sampler's (incarnation, collective state), from its
        heartbeats; `published`: the newest version the samplers already have (a resumed
        trainer's, or 0). What the trainer's heartbeats say of the group: `announced`."""
        w = cfg.weights
        self.store, self.states = store, states
        self.announced: dict[str, Any] | None = None  # the group, as heartbeats carry it
        self.timeout_s = w.collective_timeout_s
        self.keepalive_s = w.collective_timeout_s / 4  # well within the members' bound
        self.interface = wire.local_interface(w.collective_addr)
        self.meeting = Rendezvous(w.collective_addr, w.collective_timeout_s)
        self.epoch = uuid.uuid4().hex[:12]
        self.generation, self.members = 0, ()
        self.group = None
        self._sent: Manifest | None = None  # the last version's, in this generation
        # (sampler, incarnation) -> the generation it was in when that failed
        self.failed_in: dict[tuple[str, str], int] = {}
        self._incarnations: dict[str, str] = {}  # the members' at the group's forming
        self.last_queued = published
        self.first = published + 1  # the oldest version the group's members are sent
        self.seconds: dict[int, float] = {}  # version -> broadcast seconds, for the log and bench
        self._queue: queue.Queue[int] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="broadcaster", daemon=True)
        self._thread.start()

    def publish(self, version: int) -> None:
        """Version `version` is in the store: broadcast it when the thread comes to it."""
        self._queue.put(version)

    def _run(self) -> None:
        while True:
            try:
                version = self._queue.get(timeout=self.keepalive_s)
            except queue.Empty:
                version = None
            if version == CLOSE:
                return
            if version is not None:
                self.last_queued = version
            try:
                self._regroup(version)
                if self.group is not None:
                    self._send(version)
            except RuntimeError as e:  # gloo's word for a peer dead, stalled or refusing
                self._failed(wire.reason(e))
            except Exception as e:  # a fault of ours: the thread must live to be told of it
                log.error(
                    "weights: the collective broadcaster failed (%s: %s)",
                    type(e).__name__,
                    e,
                    exc_info=True,
                )
                self._failed(f"the broadcaster's own {type(e).__name__}")

    def _regroup(self, version: int | None) -> None:
        """A new generation when someone is ready to join; nothing while nobody is. `version`:
        the one about to be sent, if any (it and those queued after it go to the new group;
        those before went by stream)."""
        states = self.states()
        members = invited(states, self.members if self.group else (), self.failed_in)
        if not members or (self.group is not None and members == self.members):
            return
        if self.group is not None:
            wire.exchange_header(self.group, [wire.REFORM, self.generation + 1])
            self.group = None
        self.generation += 1
        self.members = members
        self._incarnations = {sid: states[sid][0] for sid in members if sid in states}
        key = secrets.token_hex(KEY_CHARS // 2)
        size, prefix = len(members) + 1, wire.prefix(self.generation, key)
        self.meeting.table.open(prefix, size)  # before any member can hear of it
        self.announced = GroupInfo(self.epoch, self.generation, members, key).to_json()
        self.group = wire.form(self.meeting.local, prefix, 0, size, self.interface, self.timeout_s)
        self._sent = None
        self.first = version if version is not None else self.last_queued + 1
        wire.exchange_header(self.group, [wire.KEEPALIVE, self.first])
        self.meeting.table.seal()  # every member formed its group: it took that header
        log.info(
            "weights: collective group %d formed with %s (versions from %d on)",
            self.generation,
            ", ".join(members),
            self.first,
        )

    def _send(self, version: int | None) -> None:
        assert self.group is not None
        image = self.store.get(version) if version is not None else None
        if image is None:  # a keepalive, or a version already gone from the store (by stream)
            wire.exchange_header(self.group, [wire.KEEPALIVE, self.first])
            return
        t0 = time.monotonic()
        manifest, sent = image.manifest, self._sent
        if sent is not None and _same_layout(manifest, sent):
            wire.exchange_header(
                self.group, [wire.VERSION, image.version, 0, len(manifest.sums)], manifest.sums
            )
        else:
            body = np.frombuffer(msgpack.packb(manifest.to_body()), np.uint8).copy()
            wire.exchange_header(self.group, [wire.VERSION, image.version, body.size])
            wire.broadcast(self.group, body)
        self._sent = manifest
        for index in range(len(manifest.buckets)):
            data = image.bucket_bytes(index)
            if data.size:
                wire.broadcast(self.group, np.ascontiguousarray(data))
        self.seconds[image.version] = time.monotonic() - t0
        log.info(
            "weights: version %d broadcast to %d sampler(s) in %.2f s",
            image.version,
            len(self.members),
            self.seconds[image.version],
        )

    def _failed(self, why: str) -> None:
        log.warning(
            "weights: collective group %d (%s) dropped: %s; its samplers take versions "
            "by stream until they rejoin",
            self.generation,
            ", ".join(self.members),
            why,
        )
        for sid in self.members:
            self.failed_in[(sid, self._incarnations.get(sid, ""))] = self.generation
        self.group, self.members = None, ()
        self.announced = None

    def close(self) -> None:
        """Stop after the operation under way (each is bounded by the timeout), saying so when
        it lasts: a group forming with a sampler that went away waits the bound out."""
        self._queue.put(CLOSE)
        self._thread.join(timeout=1)
        if self._thread.is_alive():
            log.info(
                "weights: closing once the collective group's operation under way ends, "
                "within %.0f s (weights.collective_timeout_s)",
                self.timeout_s,
            )
            self._thread.join(timeout=self.timeout_s + 5)
        self.meeting.close()


def _same_layout(manifest: Manifest, previous: Manifest) -> bool:
    """Whether a member can take `manifest` as `previous` with other checksums (what a header
    carries in place of a manifest)."""
    return (
        manifest.cut_like(previous)
        and manifest.adapter == previous.adapter
        and len(manifest.sums) <= wire.MAX_INLINE_SUMS
    )
