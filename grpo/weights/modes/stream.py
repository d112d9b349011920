"""weights.mode stream: rank 0 keeps the newest versions in memory and serves them bucket by
bucket on transport.weights_addr (grpo.weights.stream.server); each sampler takes a version
from the trainer or a relay, as deltas where it can, and only when it verifies against the
identity the trainer announced (grpo.weights.stream.follower)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

from grpo.config import Config
from grpo.runtime.progress import ACTIVITY, RECEIVING
from grpo.weights.modes.base import (
    Mode,
    Receiver,
    SamplerLink,
    ServingEnd,
    TrainerLink,
    Unavailable,
)
from grpo.weights.stream.follower import VersionFollower
from grpo.weights.stream.relay import announced_manifests, relay_members
from grpo.weights.stream.server import MAX_REQUEST_BYTES, StreamServer
from grpo.weights.version import Version

log = logging.getLogger("grpo.trainer")

KEPT_IDENTITIES = 64  # versions whose announced identity a sampler remembers
MAX_RELAY_CHARS = 256  # a relay's address, as a sampler's heartbeat may say it


class MemoryServer(ServingEnd):
    """Serves the store's versions, and announces the identity of each (the samplers' root of
    trust: bytes from any source are taken only when they match it)."""

    max_request_bytes = MAX_REQUEST_BYTES
    link: TrainerLink | None = None

    def start(self, link: TrainerLink) -> None:
        self.link = link
        super().start(link)

    def serve(
        self, router: zmq.Socket, closing: threading.Event, failed: Callable[[str], None]
    ) -> None:
        assert self.store is not None
        server = StreamServer(router, self.store, closing, failed)
        try:
            server.run()
        finally:  # what fan-out saved is visible here: each version's bytes, about one copy
            sent = ", ".join(f"version {v}: {n} bytes" for v, n in server.egress.bytes.items())
            log.info("weights served from memory: %s", sent or "nothing")

    def announced(self) -> dict[str, Any]:
        """The identity of each version in memory, and the relays the samplers may fetch
        from: those the trainer vouches for (grpo.delivery.pool) that said one."""
        assert self.store is not None
        members = self.link.members() if self.link is not None else {}
        relays = {
            sid: m.body["relay"]
            for sid, m in members.items()
            if m.may_serve and m.body.get("relay")
        }
        return {"manifests": self.store.identities(), "relays": relays}


class StreamReceiver(Receiver):
    def __init__(self, cfg: Config, link: SamplerLink):
        several = cfg.rollout.num_samplers > 1
        self.follower = VersionFollower(
            cfg,
            link.ctx,
            link.sampler_id,
            link.keys,
            relays=lambda: self.relays,
            announced=link.newest_version if several else None,
            seed=link.seed,
            trusted=lambda: self.manifests,
            changed=link.wake,
        )
        self.wait = link.wait
        # What the trainer's heartbeats said (`heard`), replaced whole: the follower's thread
        # reads them.
        self.relays: dict[str, str] = {}  # the live samplers' relay addresses
        # The identity of each version the trainer held in memory: the only versions this
        # sampler takes from any source (grpo.weights.stream.client.VersionFetcher).
        self.manifests: dict[int, str] = {}

    def heard(self, body: dict[str, Any], restarted: bool) -> None:
        if restarted:  # its versions are not the old one's, whatever they number
            self.manifests = {}
        if "relays" in body:
            self.relays = relay_members(body)
        if (manifests := announced_manifests(body)) is not None:
            # This incarnation's word on each version; kept after it drops one from memory,
            # as a relay may still hold it (the newest KEPT_IDENTITIES).
            merged = {**self.manifests, **manifests}
            self.manifests = dict(sorted(merged.items())[-KEPT_IDENTITIES:])

    def announced(self) -> dict[str, str]:
        address = self.follower.address
        return {"relay": address} if address and len(address) <= MAX_RELAY_CHARS else {}

    def progress(self) -> int:
        """Buckets received so far, from any source."""
        return self.follower.receiver.stats.progress

    def get(self, number: int) -> Version | None:
        """Wait for the follower to hold version `number`, checked whole. A transfer that stops
        is a stall with its name (each bucket that comes in ticks the activity)."""
        follower, image, failure = self.follower, None, None
        follower.want(number)
        with ACTIVITY.during(RECEIVING, f"version {number}"):
            seen = self.progress()

            def arrived() -> bool:
                nonlocal image, seen, failure
                if self.progress() != seen:
                    seen = self.progress()
                    ACTIVITY.tick()
                try:
                    image = follower.image(number)
                except ValueError as e:
                    failure = str(e)
                    return True
                return image is not None

            self.wait(arrived, f"version {number}")
        if failure is not None:
            raise Unavailable(failure)
        return None if image is None else Version.from_image(image)

    def forget_failure(self, number: int) -> None:
        self.follower.forget_failure(number)

    def stats(self) -> dict[str, float]:
        stats = self.follower.receiver.stats
        return {
            "weights_received_mb": stats.bytes / 2**20,
            "weights_fallbacks": float(sum(stats.fallbacks.values())),
        }

    def close(self) -> None:
        self.follower.close()


MODE = Mode("stream", from_memory=True, trainer_end=MemoryServer, receiver=StreamReceiver)
