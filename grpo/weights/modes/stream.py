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
from grpo.weights.modes.base import Mode, Receiver, SamplerLink, ServingEnd, Unavailable
from grpo.weights.stream.follower import VersionFollower
from grpo.weights.stream.server import MAX_REQUEST_BYTES, StreamServer
from grpo.weights.version import Version

log = logging.getLogger("grpo.trainer")


class MemoryServer(ServingEnd):
    """Serves the store's versions, and announces the identity of each (the samplers' root of
    trust: bytes from any source are taken only when they match it)."""

    max_request_bytes = MAX_REQUEST_BYTES

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
        assert self.store is not None
        return {"manifests": self.store.identities()}


class StreamReceiver(Receiver):
    def __init__(self, cfg: Config, link: SamplerLink):
        several = cfg.rollout.num_samplers > 1
        self.follower = VersionFollower(
            cfg,
            link.ctx,
            link.sampler_id,
            link.keys,
            relays=link.relays,
            announced=link.announced if several else None,
            seed=link.seed,
            trusted=link.manifests,
            changed=link.wake,
        )
        self.relay_address = self.follower.address
        self.wait = link.wait

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
