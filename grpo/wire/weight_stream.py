"""Weights over ZeroMQ, for samplers with no shared filesystem (transport.weights_addr).

The trainer serves its published version dirs (the durable copy) from a ROUTER socket; a
sampler's DEALER asks for a version's manifest (its version.json: each file's size and checksum),
then each file in chunks of CHUNK_BYTES, writes them into a temporary dir of its own run dir,
checks every file against the manifest, and renames the dir into place. Every message is a
checksummed control message (grpo.wire.codec), so a corrupted chunk is refused, not written.

    sampler DEALER ── manifest v / chunk v file offset ──▶ ROUTER trainer
                   ◀── manifest / chunk data / missing ──
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from grpo.core.versions import VERSION_MARKER, prune_versions, verify_version, version_dir
from grpo.wire import messages
from grpo.wire.codec import FrameError, Message, decode, encode_message

log = logging.getLogger("grpo.transport")

CHUNK_BYTES = 8 << 20


def _reply(run_dir: Path, request: Message) -> Message:
    """The answer to one request, read from the version dirs on disk."""
    version = request.body.get("version")
    if type(version) is not int or version < 0:
        return Message(messages.MISSING, {"reason": "bad version"})
    vdir = version_dir(run_dir, version)
    try:
        manifest = json.loads((vdir / VERSION_MARKER).read_text())
    except (OSError, ValueError):
        return Message(
            messages.MISSING, {"version": version, "reason": "no such version (pruned?)"}
        )
    if request.kind == messages.MANIFEST:
        return Message(messages.MANIFEST, {"version": version, "manifest": manifest})
    name, offset = request.body.get("file"), request.body.get("offset")
    # Only files the manifest lists: a request can never name a path outside the version dir.
    if (
        request.kind != messages.CHUNK
        or name not in manifest.get("files", {})
        or type(offset) is not int
    ):
        return Message(messages.MISSING, {"version": version, "reason": "bad request"})
    try:
        with open(vdir / name, "rb") as f:
            f.seek(max(0, offset))
            data = f.read(CHUNK_BYTES)
    except OSError as e:
        return Message(messages.MISSING, {"version": version, "reason": str(e)})
    return Message(
        messages.CHUNK, {"version": version, "file": name, "offset": offset, "data": data}
    )


def serve(router: zmq.Socket, run_dir: Path, closing: threading.Event) -> None:
    """Answer requests until `closing`; malformed ones are dropped (logged)."""
    try:
        while not closing.is_set():
            if not router.poll(timeout=200):
                continue
            identity, *frames = router.recv_multipart()
            try:
                request = decode(frames, max_frame_bytes=1 << 20)
            except FrameError as e:
                log.warning("dropped a malformed weights request: %s", e)
                continue
            if isinstance(request, Message):
                router.send_multipart([identity, *encode_message(_reply(run_dir, request))])
    except zmq.ZMQError:
        pass  # closed at shutdown
    except Exception:
        log.exception("the weights server failed; samplers will keep their weights")
    finally:
        router.close()


class _Client:
    def __init__(self, socket: zmq.Socket, addr: str, timeout_s: float):
        self.socket, self.addr, self.timeout_s = socket, addr, timeout_s

    def ask(self, kind: str, **body: Any) -> dict[str, Any]:
        self.socket.send_multipart(encode_message(Message(kind, body)))
        if not self.socket.poll(timeout=int(self.timeout_s * 1000)):
            raise ValueError(
                f"no answer from the trainer's weights server at {self.addr} for "
                f"{self.timeout_s:.0f} s (is transport.weights_addr the trainer's?)"
            )
        try:
            reply = decode(self.socket.recv_multipart(), max_frame_bytes=2 * CHUNK_BYTES)
        except FrameError as e:
            raise ValueError(f"a corrupt reply from the weights server: {e}") from None
        if not isinstance(reply, Message) or reply.kind not in (kind, messages.MISSING):
            raise ValueError("an unexpected reply from the weights server")
        if reply.kind == messages.MISSING:
            raise ValueError(f"the trainer cannot serve it: {reply.body.get('reason')}")
        return reply.body


def fetch_version(
    socket: zmq.Socket, addr: str, run_dir: Path, version: int, timeout_s: float, keep: int
) -> tuple[Path, int]:
    """Copy version `version` into this run dir unless an intact copy is there already.
    Returns the dir and the bytes transferred; raises ValueError saying what went wrong."""
    final = version_dir(run_dir, version)
    try:
        verify_version(final)
        return final, 0
    except ValueError:
        pass  # not here yet (or damaged): fetch it
    client = _Client(socket, addr, timeout_s)
    manifest = client.ask(messages.MANIFEST, version=version)["manifest"]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(n, str) and "/" not in n and n not in ("", ".", "..") for n in files
    ):
        raise ValueError("the weights server sent a malformed manifest")
    tmp = final.with_name(f".{final.name}.fetch")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    total = 0
    for name, digest in files.items():
        with open(tmp / name, "wb") as f:
            while f.tell() < digest["bytes"]:
                body = client.ask(messages.CHUNK, version=version, file=name, offset=f.tell())
                if not body.get("data"):
                    raise ValueError(f"{name} of version {version} ended early on the server")
                f.write(body["data"])
                total += len(body["data"])
    (tmp / VERSION_MARKER).write_text(json.dumps(manifest))
    verify_version(tmp)  # every file against its checksum before the dir becomes visible
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
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
    ):
        self.ctx, self.addr, self.timeout_s, self.secure = ctx, addr, timeout_s, secure
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.secure is not None:
            self.secure(sock)
        sock.connect(self.addr)
        return sock

    def fetch(self, run_dir: Path, version: int, keep: int) -> Path:
        t0 = time.monotonic()
        try:
            vdir, size = fetch_version(
                self.socket, self.addr, run_dir, version, self.timeout_s, keep
            )
        except (ValueError, OSError, KeyError, TypeError) as e:
            self.socket.close()
            self.socket = self._connect()
            raise ValueError(f"could not fetch version {version}: {e}") from None
        if size:
            log.info(
                "fetched version %d from %s: %.1f MB in %.1f s",
                version, self.addr, size / 1e6, time.monotonic() - t0,
            )  # fmt: skip
        return vdir

    def close(self) -> None:
        self.socket.close()
