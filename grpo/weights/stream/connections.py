"""A receiver's sockets to its sources (grpo.weights.stream.client): new ones for each attempt
at a source, so that a late answer from an abandoned attempt can never be taken for another's.
With `reuse`, the sockets of an attempt that brought a version whole (every request answered:
nothing late can come on them) are kept for the next version from the same source, which then
pays no TCP connection and handshake (about a millisecond a version on loopback)."""

from __future__ import annotations

from collections.abc import Callable

import zmq

from grpo.weights.stream.server import MAX_REQUEST_BYTES
from grpo.wire.channels import SocketLimits, new_socket


class SourceFailed(Exception):
    """This source cannot give the version: try the next one."""


class Connections:
    def __init__(
        self,
        ctx: zmq.Context,
        secure: Callable[[zmq.Socket, str], None] | None,
        window: int,
        reuse: bool,
    ):
        """`secure(sock, addr)`: CURVE for a connection to `addr` (None: plain TCP); `window`:
        the requests a socket may have in flight."""
        self.ctx, self.secure, self.window, self.reuse = ctx, secure, window, reuse
        self.kept: dict[tuple[str, int], zmq.Socket] = {}  # (source, frame limit) -> socket

    def attempt(self, addr: str) -> Attempt:
        return Attempt(self, addr)

    def close(self) -> None:
        """Close the sockets kept for the next version (from the thread that used them)."""
        _close(self.kept)

    def connect(self, addr: str, largest: int) -> zmq.Socket:
        """A new socket to `addr` taking no frame over `largest` bytes (and a request's
        header); SourceFailed (the next source is tried) when the address does not resolve or
        this source's keys cannot be had."""
        limits = SocketLimits(largest + MAX_REQUEST_BYTES, max(2 * self.window, 2))
        sock = new_socket(self.ctx, zmq.DEALER, linger_ms=0, limits=limits)
        try:
            if self.secure is not None:
                self.secure(sock, addr)  # CURVE: the keys for this source
            sock.connect(addr)
        except (zmq.ZMQError, OSError, ValueError) as e:
            sock.close()
            raise SourceFailed(f"cannot connect: {e}") from None
        return sock


class Attempt:
    """The sockets one attempt at a source uses: closed if it fails, kept for the next version
    (with `reuse`) if it brings one whole."""

    def __init__(self, connections: Connections, addr: str):
        self.connections, self.addr = connections, addr
        self.used: dict[tuple[str, int], zmq.Socket] = {}

    def socket(self, largest: int) -> zmq.Socket:
        """A socket to the source taking no frame over `largest` bytes: this attempt's, else
        the one kept from the last version, else a new one."""
        key = (self.addr, largest)
        if key not in self.used:
            kept = self.connections.kept.pop(key, None)
            self.used[key] = kept if kept is not None else self.connections.connect(*key)
        return self.used[key]

    def drop(self, largest: int) -> None:
        """Close the socket for frames up to `largest` bytes: what is on its way on it is not
        wanted any more."""
        self.used.pop((self.addr, largest)).close()

    def failed(self) -> None:
        _close(self.used)

    def succeeded(self) -> None:
        """The version came whole: its sockets are kept (with `reuse`), those kept for any
        other source closed."""
        self.connections.close()
        if self.connections.reuse:
            self.connections.kept = self.used
        else:
            _close(self.used)


def _close(sockets: dict[tuple[str, int], zmq.Socket]) -> None:
    for sock in sockets.values():
        sock.close()
    sockets.clear()
