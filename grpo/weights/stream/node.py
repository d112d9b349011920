"""A relaying sampler's weights side, without its engine: a StreamServer thread serving a
RelaySource, and a VersionFetcher whose manifest, buckets and finished versions feed that source, so
that every bucket it has checked is served on to its children while the rest is still coming
(grpo.weights.stream.relay). The sampler's VersionFollower relays through one; benchmarks and
tests make theirs with RelayNode.on_loopback.

Torch-free, like the modules it joins: a benchmark runs dozens of these, one per process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import zmq

from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.image import Image
from grpo.weights.stream.relay import RelaySource
from grpo.weights.stream.server import MAX_REQUEST_BYTES, StreamServer
from grpo.wire.channels import SocketLimits, new_socket

REQUEST_HWM = 1000  # requests queued per child; each is a few dozen bytes


class RelayNode:
    """Serves what it holds or is receiving on `router` (bound, CURVE set up by its maker) from
    start() until close(); receive() takes a version through `receiver` from the first of
    `sources` that can give it. `failed(cause)` if the serving loop ends other than by
    close() (by default the cause goes to `failures`)."""

    def __init__(
        self,
        router: zmq.Socket,
        receiver: VersionFetcher,
        delta: bool = True,
        failed: Callable[[str], None] | None = None,
    ):
        self.source = RelaySource(delta)
        self.receiver = receiver
        self.addr = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.closing = threading.Event()
        self.failures: list[str] = []
        self.server = StreamServer(
            router, self.source, self.closing, failed or self.failures.append
        )
        self._thread = threading.Thread(target=self.server.run, name="relay-server", daemon=True)

    @classmethod
    def on_loopback(
        cls, ctx: zmq.Context, max_bytes: int, timeout_s: float, window: int = 4, delta: bool = True
    ) -> RelayNode:
        """A node on a free loopback port, without CURVE: benchmarks and tests."""
        router = new_socket(
            ctx, zmq.ROUTER, linger_ms=0, limits=SocketLimits(MAX_REQUEST_BYTES, REQUEST_HWM)
        )
        router.bind_to_random_port("tcp://127.0.0.1")
        return cls(router, VersionFetcher(ctx, None, max_bytes, timeout_s, window, delta), delta)

    def start(self) -> RelayNode:
        self._thread.start()
        return self

    @property
    def held(self) -> Image | None:
        return self.source.held

    def receive(
        self, version: int, sources: Sequence[str], delta: bool = True, newer: bool = False
    ) -> Image:
        """Version `version` (`newer`: or a newer one, VersionFetcher.receive), complete and
        checked, now also served to this node's children; ValueError if no source could give it.
        `delta`: ask against the version held (else full copies)."""
        image = self.receiver.receive(
            sources,
            version,
            self.source.held if delta else None,
            sink=self.source.took,
            staged=self.source.started,
            newer=newer,
        )
        self.source.finished(image)
        return image

    def close(self) -> None:
        self.closing.set()
        self._thread.join(5)
