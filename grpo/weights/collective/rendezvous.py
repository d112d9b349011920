"""Where a collective group's ranks meet: a small key-value store the trainer serves on
weights.collective_addr, holding only the generation it is forming.

torch's TCPStore took any key of any size from anyone who connected (24 values of 8 MiB set
from outside grew a trainer by 219 MiB) and has no hook to refuse them. This one:

- listens on collective_addr's host alone;
- takes keys only under the prefix of the generation being formed, whose secret part the
  trainer announces over the control channel: a peer that never heard it can set nothing;
- holds at most `keys_for(size)` keys of at most MAX_VALUE_BYTES each, one generation's, and
  none once the group is formed (`seal`);
- serves at most MAX_CONNECTIONS connections at once, and closes one idle past the timeout.

gloo's rendezvous needs set, get and wait alone: each rank sets its address (about 170 bytes)
under "<prefix>/0/<rank>" and reads the others'. A request is one frame: an op byte, the key's
and the value's lengths (uint16, uint32, big-endian), the key, the value; the reply a status
byte and a uint32-prefixed value (a refusal's reason).

A `Store` handed to gloo must stay referenced while gloo uses it: the C++ side holds the
object, not the Python methods it calls (collected, they fail as "Not implemented").
"""

from __future__ import annotations

import datetime
import logging
import socket
import struct
import threading
import time
from collections.abc import Sequence

import torch.distributed as dist

from grpo.config.weights import host_port
from grpo.runtime.refusals import note

log = logging.getLogger("grpo.trainer")

MAX_KEY_BYTES = 256
MAX_VALUE_BYTES = 64 << 10
MAX_CONNECTIONS = 64
POLL_S = 0.01  # how often a wait for another rank's key looks again
SET, GET = b"S", b"G"
OK, MISSING, REFUSED = b"\x01", b"\x00", b"\x02"
_REQUEST = struct.Struct(">cHI")
_REPLY = struct.Struct(">cI")


def keys_for(size: int) -> int:
    """The keys a generation of `size` ranks may hold: one per rank, with room to spare."""
    return 2 * size + 8


class Table:
    """The one generation's keys the trainer's rendezvous holds, and what it refuses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}
        self._prefix: str | None = None  # None: no generation forming, nothing taken
        self._max_keys = 0

    def open(self, prefix: str, size: int) -> None:
        """Take keys under `prefix` for a generation of `size` ranks (the last one's go)."""
        with self._lock:
            self._values, self._prefix, self._max_keys = {}, prefix + "/", keys_for(size)

    def seal(self) -> None:
        """The generation formed: its keys go, and no key is taken until the next opens."""
        with self._lock:
            self._values, self._prefix = {}, None

    def set(self, key: str, value: bytes) -> str | None:
        """None once `key` holds `value`; else why it was refused."""
        with self._lock:
            if self._prefix is None or not key.startswith(self._prefix):
                why = "a key outside the generation being formed"
            elif key not in self._values and len(self._values) >= self._max_keys:
                why = f"more than {self._max_keys} keys in one generation"
            elif len(value) > MAX_VALUE_BYTES:
                why = f"a value of {len(value)} bytes (at most {MAX_VALUE_BYTES})"
            else:
                self._values[key] = value
                return None
            return why

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)


class _PollingStore(dist.Store):
    """What gloo calls: set, and get/wait polling until the key is there or the timeout
    passes (RuntimeError, as TCPStore's)."""

    def __init__(self, timeout_s: float):
        super().__init__()
        self.timeout_s = timeout_s
        self._clones: list[dist.Store] = []  # kept alive while this one is (see above)

    def _set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _try_get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _fresh(self) -> _PollingStore:
        raise NotImplementedError

    def set(self, key: str, value: bytes) -> None:
        self._set(key, bytes(value))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while (value := self._try_get(key)) is None:
            if time.monotonic() > deadline:  # the key's tail: its head is the secret
                raise RuntimeError(
                    f"the rendezvous had no key .../{key.partition('/')[2]} "
                    f"within {self.timeout_s:g} s"
                )
            time.sleep(POLL_S)
        return value

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        for key in keys:
            self.get(key)

    def check(self, keys: Sequence[str]) -> bool:
        return all(self._try_get(key) is not None for key in keys)

    def clone(self) -> dist.Store:
        twin = self._fresh()
        self._clones.append(twin)
        return twin

    def has_extended_api(self) -> bool:
        return False


class LocalStore(_PollingStore):
    """The trainer's own seat (rank 0): the table itself, under the same rules."""

    def __init__(self, table: Table, timeout_s: float):
        super().__init__(timeout_s)
        self.table = table

    def _set(self, key: str, value: bytes) -> None:
        if (why := self.table.set(key, value)) is not None:
            raise RuntimeError(f"the rendezvous refused {why}")

    def _try_get(self, key: str) -> bytes | None:
        return self.table.get(key)

    def _fresh(self) -> LocalStore:
        return LocalStore(self.table, self.timeout_s)


class RemoteStore(_PollingStore):
    """A sampler's way into the trainer's rendezvous at `addr` (tcp://host:port)."""

    def __init__(self, addr: str, timeout_s: float):
        super().__init__(timeout_s)
        self.addr = addr
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _ask(self, op: bytes, key: str, value: bytes = b"") -> tuple[bytes, bytes]:
        raw = key.encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(host_port(self.addr), self.timeout_s)
                self._sock.sendall(_REQUEST.pack(op, len(raw), len(value)) + raw + value)
                status, size = _REPLY.unpack(_read(self._sock, _REPLY.size))
                if size > MAX_VALUE_BYTES:
                    raise ConnectionError(f"a reply of {size} bytes")
                return status, _read(self._sock, size)
            except OSError as e:
                self.close_connection()
                raise RuntimeError(f"the rendezvous at {self.addr}: {e}") from None

    def _set(self, key: str, value: bytes) -> None:
        status, why = self._ask(SET, key, value)
        if status != OK:
            raise RuntimeError(f"the rendezvous refused {why.decode(errors='replace')}")

    def _try_get(self, key: str) -> bytes | None:
        status, value = self._ask(GET, key)
        return value if status == OK else None

    def _fresh(self) -> RemoteStore:
        return RemoteStore(self.addr, self.timeout_s)

    def close_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for twin in self._clones:
            assert isinstance(twin, RemoteStore)
            twin.close_connection()


def _read(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 16))
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Rendezvous:
    """The trainer's rendezvous, served on `addr` until `close`: `table` holds what it
    takes, `local` is rank 0's store."""

    def __init__(self, addr: str, timeout_s: float):
        hostname, port = host_port(addr)
        family = socket.AF_INET6 if ":" in hostname else socket.AF_INET
        self.table = Table()
        self.local = LocalStore(self.table, timeout_s)
        self.timeout_s = timeout_s
        self._listener = socket.create_server((hostname, port), family=family, backlog=128)
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._turned_away = self.refused = 0
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="rendezvous", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            if not self._connections.acquire(blocking=False):
                self._turned_away += 1
                note(
                    log,
                    self._turned_away,
                    "weights: the collective rendezvous turned away "
                    "a connection from %s: %d open already (%d turned away so far)",
                    peer[0],
                    MAX_CONNECTIONS,
                    self._turned_away,
                )
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer[0]), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        """Answer `conn`'s requests until it closes, sends a malformed one, or idles past the
        timeout."""
        conn.settimeout(self.timeout_s)
        try:
            while not self._closed.is_set():
                op, key_len, value_len = _REQUEST.unpack(_read(conn, _REQUEST.size))
                if op not in (SET, GET) or key_len > MAX_KEY_BYTES or value_len > MAX_VALUE_BYTES:
                    self._refused(peer, "a malformed request")
                    return
                key = _read(conn, key_len).decode(errors="replace")
                value = _read(conn, value_len)
                conn.sendall(self._answer(op, key, value, peer))
        except (OSError, struct.error):
            pass  # gone, idle or cut short: nothing was taken from it
        finally:
            conn.close()
            self._connections.release()

    def _answer(self, op: bytes, key: str, value: bytes, peer: str) -> bytes:
        if op == GET:
            found = self.table.get(key)
            if found is None:
                return _REPLY.pack(MISSING, 0)
            return _REPLY.pack(OK, len(found)) + found
        why = self.table.set(key, value)
        if why is None:
            return _REPLY.pack(OK, 0)
        self._refused(peer, why)
        reason = why.encode()
        return _REPLY.pack(REFUSED, len(reason)) + reason

    def _refused(self, peer: str, why: str) -> None:
        self.refused += 1
        note(
            log,
            self.refused,
            "weights: the collective rendezvous refused %s from %s (%d refused so far)",
            why,
            peer,
            self.refused,
        )

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
