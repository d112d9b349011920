"""Rank 0's weights server on transport.weights_addr: a socket and a thread of its own, apart
from the episode channel (grpo.wire.trainer_channel), serving what the mode serves (the version
dirs, weights.mode files; the versions in memory, stream and collective). It lives from the
trainer's start until every sampler has said bye, and a failure of its thread stops the run with
its cause (`failed`), as the episode channel's own threads do."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import zmq

from grpo.config import TransportConfig
from grpo.wire.channels import PeerError, SocketLimits, bind, check_listening, new_socket
from grpo.wire.keys import secure_server

log = logging.getLogger("grpo.transport")

# Answers requests on a ROUTER socket until the event is set; calls back with the cause if it
# fails (grpo.weights.files.serve, grpo.weights.stream.server.StreamServer).
Serve = Callable[[zmq.Socket, threading.Event, Callable[[str], None]], None]


class WeightsServer:
    def __init__(
        self,
        transport: TransportConfig,
        serve: Serve,
        max_request_bytes: int,
        failed: Callable[[str], None],
    ):
        """`serve(router, closing, failed)`: the mode's answers; `max_request_bytes`: the
        largest request it takes (the socket drops larger ones unread); `failed(why)`: how the
        run learns that the server ended (the episode channel raises it at its next receive)."""
        addr = transport.weights_addr
        check_listening(
            {"transport.weights_addr": addr},
            curve=bool(transport.curve_dir),
            allow_insecure=transport.allow_insecure,
        )
        self.ctx = zmq.Context()
        limits = SocketLimits.of(transport, max_request_bytes)
        router = new_socket(self.ctx, zmq.ROUTER, linger_ms=0, limits=limits)
        self._auth = None
        try:
            if transport.curve_dir:
                self._auth = secure_server(self.ctx, [router], Path(transport.curve_dir))
            bind(router, addr, "weights")
        except (PeerError, ValueError):
            router.close()
            self._stop_auth()
            self.ctx.term()
            raise
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=serve, args=(router, self._closing, failed), daemon=True, name="weights"
        )
        self._thread.start()

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()

    def close(self) -> None:
        """Stop serving (the serve function closes its socket on the way out)."""
        if self.ctx.closed:
            return
        self._closing.set()
        self._thread.join(timeout=5)
        self._stop_auth()
        self.ctx.term()
