"""A relaying sampler's weights side, without its engine: a StreamServer thread serving a
RelaySource, and a Receiver whose manifest, buckets and finished versions feed that source, so
that every bucket it has checked is served on to its children while the rest is still coming
(grpo.delivery.stream.relay).

Torch-free, like the modules it joins: a benchmark runs dozens of these, one per process.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import zmq

from grpo.delivery.stream.client import Receiver
from grpo.delivery.stream.image import Image
from grpo.delivery.stream.relay import RelaySource
from grpo.delivery.stream.server import MAX_REQUEST_BYTES, StreamServer
from grpo.wire.channels import SocketLimits, new_socket

REQUEST_HWM = 1000  # requests queued per child; each is a few dozen bytes


class RelayNode:
    """Serves what it holds or is receiving at `addr` (bound on `host`, a free port) from
    start() until close(); receive() takes a version from the first of `sources` that can
    give it. Without CURVE: loopback and benchmarks (a deployment's sockets need its keys)."""

    def __init__(
        self,
        ctx: zmq.Context,
        max_bytes: int,
        timeout_s: float,
        host: str = "tcp://127.0.0.1",
        window: int = 4,
        delta: bool = True,
    ):
        self.source = RelaySource(delta)
        self.receiver = Receiver(ctx, None, max_bytes, timeout_s, window, delta)
        router = new_socket(
            ctx, zmq.ROUTER, linger_ms=0, limits=SocketLimits(MAX_REQUEST_BYTES, REQUEST_HWM)
        )
        self.addr = f"{host}:{router.bind_to_random_port(host)}"
        self.closing = threading.Event()
        self.failures: list[str] = []  # the serving loop's, if it ended other than by close()
        self.server = StreamServer(router, self.source, self.closing, self.failures.append)
        self._thread = threading.Thread(target=self.server.run, name="relay-server", daemon=True)

    def start(self) -> RelayNode:
        self._thread.start()
        return self

    @property
    def held(self) -> Image | None:
        return self.source.held

    def receive(self, version: int, sources: Sequence[str], delta: bool = True) -> Image:
        """Version `version`, complete and checked, now also served to this node's children;
        ValueError if no source could give it. `delta`: ask against the version held (else
        full copies)."""
        image = self.receiver.receive(
            sources,
            version,
            self.source.held if delta else None,
            sink=self.source.took,
            staged=self.source.started,
        )
        self.source.finished(image)
        return image

    def close(self) -> None:
        self.closing.set()
        self._thread.join(5)
