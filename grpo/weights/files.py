"""Weights over ZeroMQ, for samplers with no shared filesystem (transport.weights_addr).

The trainer serves its published version dirs (the durable copy) from a ROUTER socket; a
sampler's DEALER asks for a version's manifest (its version.json: each file's size and checksum),
then each file in chunks of CHUNK_BYTES, writes them into a temporary dir of its own run dir,
checks every file against the manifest, and renames the dir into place. Every message is a
checksummed control message (grpo.wire.codec), so a corrupted chunk is refused, not written.

Neither end trusts the other's messages: the server answers every request on its own (a
malformed one gets MISSING, never ends the serving thread), and the client checks every reply
against its request, the manifest's sizes against transport.max_version_bytes and the free
disk before writing, and uses a local copy only when its manifest is the server's.

    sampler DEALER ── manifest v / chunk v file offset ──▶ ROUTER trainer
                   ◀── manifest / chunk data / missing ──
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from grpo.runtime.refusals import worth_logging
from grpo.weights.dirs import VERSION_MARKER, prune_versions, verify_version, version_dir
from grpo.wire import messages
from grpo.wire.channels import SocketLimits, new_socket
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.transport")

CHUNK_BYTES = 8 << 20
MAX_REQUEST_BYTES = 1 << 20  # a request is a version, a file name and an offset
MAX_REPLY_BYTES = 2 * CHUNK_BYTES  # a chunk and its header, or a manifest
FETCH_SUFFIX = ".fetch"


def _missing(reason: str, version: Any = None) -> Message:
    return Message(messages.MISSING, {"version": version, "reason": reason})


def _reply(run_dir: Path, request: Message) -> Message:
    """The answer to one request, read from the version dirs on disk. Raises only on a bug
    or a disk error; serve answers those too."""
    version = request.body.get("version")
    if type(version) is not int or version < 0:
        return _missing("bad version")
    if request.kind not in (messages.MANIFEST, messages.CHUNK):
        return _missing(f"unknown request {request.kind!r}", version)
    vdir = version_dir(run_dir, version)
    try:
        manifest = json.loads((vdir / VERSION_MARKER).read_text())
    except (OSError, ValueError):
        return _missing("no such version (pruned?)", version)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return _missing(f"the trainer's {VERSION_MARKER} of it is unreadable", version)
    if request.kind == messages.MANIFEST:
        return Message(messages.MANIFEST, {"version": version, "manifest": manifest})
    name, offset = request.body.get("file"), request.body.get("offset")
    # Only files the manifest lists: a request can never name a path outside the version dir.
    if type(name) is not str or name not in files or type(offset) is not int or offset < 0:
        return _missing("bad request", version)
    try:
        with open(vdir / name, "rb") as f:
            if offset > os.fstat(f.fileno()).st_size:
                return _missing("bad request", version)
            f.seek(offset)
            data = f.read(CHUNK_BYTES)
    except OSError as e:
        return _missing(str(e), version)
    return Message(
        messages.CHUNK, {"version": version, "file": name, "offset": offset, "data": data}
    )


class _Refusals:
    """Counts refused requests, logged as grpo.runtime.refusals says."""

    def __init__(self) -> None:
        self.count = 0

    def note(self, why: str) -> None:
        self.count += 1
        if worth_logging(self.count):
            log.warning("weights server: %s (%d refused so far)", why, self.count)


def _answer(run_dir: Path, frames: list[bytes], refusals: _Refusals) -> list[bytes] | None:
    """The reply frames to one request, or None to drop it: nothing a request holds can
    raise out of here."""
    try:
        request = decode(frames, max_frame_bytes=MAX_REQUEST_BYTES)
    except FrameError as e:
        refusals.note(f"dropped a malformed request: {e}")
        return None
    if not isinstance(request, Message):
        refusals.note("dropped a batch sent as a weights request")
        return None
    try:
        reply = _reply(run_dir, request)
    except Exception as e:  # a request must not end the server, whatever it holds
        refusals.note(f"{request.kind} request failed: {type(e).__name__}: {e}")
        reply = _missing(f"the server could not answer: {type(e).__name__}")
    if reply.kind == messages.MISSING and reply.body["reason"] != "no such version (pruned?)":
        refusals.note(f"answered a {request.kind!r} request: {reply.body['reason']}")
    return encode_message(reply)


def serve(
    router: zmq.Socket,
    run_dir: Path,
    closing: threading.Event,
    failed: Callable[[str], None],
) -> None:
    """Answer requests until `closing`, each on its own (a malformed one is answered MISSING
    or dropped, logged). If the thread ends any other way, `failed(cause)` says why, so the
    run stops with it instead of its samplers keeping old weights."""
    refusals = _Refusals()
    try:
        while not closing.is_set():
            if not router.poll(timeout=200):
                continue
            identity, *frames = router.recv_multipart()
            reply = _answer(run_dir, frames, refusals)
            if reply is not None:  # to a peer gone or too slow, ROUTER drops it: no wait
                router.send_multipart([identity, *reply])
    except zmq.ZMQError as e:
        if not closing.is_set():
            failed(f"the weights server failed: ZMQError: {e}")
    except Exception as e:
        log.exception("the weights server failed")
        failed(f"the weights server failed: {type(e).__name__}: {e}")
    finally:
        router.close()


class _Client:
    def __init__(self, socket: zmq.Socket, addr: str, timeout_s: float):
        self.socket, self.addr, self.timeout_s = socket, addr, timeout_s

    def ask(self, kind: str, **body: Any) -> dict[str, Any]:
        """The reply's body; ValueError unless it answers this very request."""
        self.socket.send_multipart(encode_message(Message(kind, body)))
        if not self.socket.poll(timeout=int(self.timeout_s * 1000)):
            raise ValueError(
                f"no answer from the trainer's weights server at {self.addr} for "
                f"{self.timeout_s:.0f} s (is transport.weights_addr the trainer's?)"
            )
        try:
            reply = decode(self.socket.recv_multipart(), max_frame_bytes=MAX_REPLY_BYTES)
        except FrameError as e:
            raise ValueError(f"a corrupt reply from the weights server: {e}") from None
        if not isinstance(reply, Message) or reply.kind not in (kind, messages.MISSING):
            raise ValueError("an unexpected reply from the weights server")
        if reply.kind == messages.MISSING:
            raise ValueError(f"the trainer cannot serve it: {reply.body.get('reason')}")
        for key, want in body.items():
            if reply.body.get(key) != want or type(reply.body.get(key)) is not type(want):
                raise ValueError(
                    f"the weights server answered {key} {reply.body.get(key)!r} where "
                    f"{want!r} was asked for"
                )
        return reply.body


def check_manifest(manifest: Any, version: int, max_bytes: int) -> dict[str, int]:
    """Each file's size from a server's manifest, refused (ValueError) unless every name is a
    plain file name, every size an int >= 0, and each size and their total within
    `max_bytes` (transport.max_version_bytes)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("version", version) != version:
        raise ValueError("the weights server sent a malformed manifest")
    sizes = {}
    for name, digest in files.items():
        size = digest.get("bytes") if isinstance(digest, dict) else None
        if not (isinstance(name, str) and "/" not in name and name not in ("", ".", "..")):
            raise ValueError(f"the weights server's manifest names a bad file {name!r:.80}")
        if type(size) is not int or size < 0:
            raise ValueError(f"the weights server's manifest gives {name} no size")
        sizes[name] = size
    total = sum(sizes.values())
    if total > max_bytes:
        big = max(sizes, key=sizes.__getitem__)
        raise ValueError(
            f"version {version} lists {total} bytes ({big}: {sizes[big]}), over "
            f"transport.max_version_bytes ({max_bytes}): refused before writing"
        )
    return sizes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_fetch_dirs(versions: Path) -> None:
    """Remove temporary fetch dirs left by this process or by one that is gone (killed
    mid-fetch); those of a live sampler sharing this run dir are its own."""
    for tmp in versions.glob(f".v*{FETCH_SUFFIX}*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _download(client: _Client, tmp: Path, version: int, sizes: dict[str, int]) -> int:
    total = 0
    for name, size in sizes.items():
        with open(tmp / name, "wb") as f:
            while f.tell() < size:
                offset = f.tell()
                body = client.ask(messages.CHUNK, version=version, file=name, offset=offset)
                data = body.get("data")
                if not isinstance(data, bytes) or not data:
                    raise ValueError(f"{name} of version {version} ended early on the server")
                if len(data) > size - offset:
                    raise ValueError(f"{name} of version {version} is longer than its manifest")
                f.write(data)
                total += len(data)
    return total


def fetch_version(
    socket: zmq.Socket,
    addr: str,
    run_dir: Path,
    version: int,
    timeout_s: float,
    keep: int,
    max_bytes: int = 1 << 40,
) -> tuple[Path, int]:
    """Copy version `version` into this run dir unless an intact copy of the server's very
    version is there already (an earlier run of the same name may have left its own).
    Returns the dir and the bytes transferred; raises ValueError saying what went wrong."""
    final = version_dir(run_dir, version)
    client = _Client(socket, addr, timeout_s)
    manifest = client.ask(messages.MANIFEST, version=version)["manifest"]
    sizes = check_manifest(manifest, version, max_bytes)
    try:
        if json.loads((final / VERSION_MARKER).read_text()) == manifest:
            verify_version(final)
            return final, 0
    except (OSError, ValueError):
        pass  # not here, another run's or damaged: fetch it
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_fetch_dirs(final.parent)
    free = shutil.disk_usage(final.parent).free
    if sum(sizes.values()) > free:
        raise ValueError(f"version {version} needs {sum(sizes.values())} bytes, {free} free")
    tmp = final.with_name(f".{final.name}{FETCH_SUFFIX}-{os.getpid()}")
    tmp.mkdir()
    try:
        total = _download(client, tmp, version, sizes)
        (tmp / VERSION_MARKER).write_text(json.dumps(manifest))
        verify_version(tmp)  # every file against its checksum before the dir becomes visible
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_versions(run_dir, keep)
    return final, total


class WeightFetcher:
    """The sampler's end: one DEALER socket, re-made after a failed fetch so a late answer to
    an abandoned request is never taken for the next one's."""

    def __init__(
        self,
        ctx: zmq.Context,
        addr: str,
        timeout_s: float,
        secure: Callable[[zmq.Socket], None] | None = None,
        limits: SocketLimits | None = None,
        max_bytes: int = 1 << 40,
    ):
        self.ctx, self.addr, self.timeout_s, self.secure = ctx, addr, timeout_s, secure
        hwm = limits.receive_hwm if limits is not None else 2
        self.limits = SocketLimits(MAX_REPLY_BYTES, hwm)
        self.max_bytes = max_bytes
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = new_socket(self.ctx, zmq.DEALER, linger_ms=0, limits=self.limits)
        if self.secure is not None:
            self.secure(sock)
        sock.connect(self.addr)
        return sock

    def fetch(self, run_dir: Path, version: int, keep: int) -> Path:
        t0 = time.monotonic()
        try:
            vdir, size = fetch_version(
                self.socket, self.addr, run_dir, version, self.timeout_s, keep, self.max_bytes
            )
        except (ValueError, OSError, KeyError, TypeError) as e:
            self.socket.close()
            self.socket = self._connect()
            raise ValueError(f"could not fetch version {version}: {e}") from None
        if size:
            log.info(
                "fetched version %d from %s: %.1f MB in %.1f s",
                version,
                self.addr,
                size / 1e6,
                time.monotonic() - t0,
            )
        return vdir

    def close(self) -> None:
        self.socket.close()
