"""A sampler's end of weights.mode: stream: a thread that receives the versions it is asked
for into host memory (checked, all or nothing) and, with several samplers, serves what it holds
to the samplers below it in the relay tree (grpo.weights.stream.relay).

A lone sampler receives exactly the version its next batch needs, when it needs it (which weights
sample a batch never depends on timing). With relays, a sampler receives every announced
version as soon as it is out, whatever it is doing, so that the samplers below it never wait for
its generation to finish.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import zmq
from zmq.auth.thread import ThreadAuthenticator

from grpo.config import Config
from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.image import Image
from grpo.weights.stream.node import RelayNode
from grpo.weights.stream.relay import sources
from grpo.wire.channels import SocketLimits, check_listening, is_loopback, new_socket
from grpo.wire.keys import ClientKeys, relay_key, secure_server

log = logging.getLogger("grpo.sampler")

PASS_OVER_S = 30.0
KEPT_BROADCASTS = 3  # versions the collective group brought that a sampler keeps at hand


class SourceKeys:
    """CURVE for a connection to a source: the trainer's key for the trainer, a relay's own
    for a relay (found by its address among the live samplers', read once)."""

    def __init__(
        self,
        keys: ClientKeys,
        curve_dir: Path,
        trainer_addr: str,
        relays: Callable[[], dict[str, str]],
    ):
        self.keys, self.curve_dir = keys, curve_dir
        self.trainer_addr, self.relays = trainer_addr, relays
        self._relay_keys: dict[str, bytes] = {}  # sampler id -> the key its relay serves with

    def __call__(self, sock: zmq.Socket, addr: str) -> None:
        relay = next((sid for sid, a in self.relays().items() if a == addr), None)
        if relay is None or addr == self.trainer_addr:
            self.keys.apply(sock)
            return
        if relay not in self._relay_keys:
            self._relay_keys[relay] = relay_key(self.curve_dir, relay)
        self.keys.apply(sock, self._relay_keys[relay])


def advertised(bound: str, host: str) -> str:
    """The address other samplers reach a relay bound at `bound` (zmq's LAST_ENDPOINT) on."""
    parts = urlsplit(bound)
    if host or parts.hostname in ("0.0.0.0", "::", "*"):
        host = host or socket.gethostbyname(socket.gethostname())
        return f"{parts.scheme}://{host}:{parts.port}"
    return bound


class OwnRelay:
    """This sampler's relay (several samplers, weights.fanout > 0): a ROUTER on
    weights.relay_addr, a CURVE server with this sampler's pair, serving the samplers below it
    each version this one holds, bucket by bucket as it comes in (grpo.weights.stream.node)."""

    def __init__(
        self,
        cfg: Config,
        ctx: zmq.Context,
        sampler_id: str,
        keys: ClientKeys | None,
        receiver: VersionFetcher,
        seed: Image | None,
    ):
        w = cfg.weights
        self.sampler_id = sampler_id
        self._auth: ThreadAuthenticator | None = None
        router = self._bind(cfg, ctx, keys is not None)
        self.node = RelayNode(router, receiver, w.delta, self._failed).start()
        self.address = advertised(self.node.addr, w.relay_host)  # told in its heartbeats
        if seed is not None:
            self.node.source.finished(seed)

    def _bind(self, cfg: Config, ctx: zmq.Context, keyed: bool) -> zmq.Socket:
        w, t = cfg.weights, cfg.transport
        check_listening({"weights.relay_addr": w.relay_addr}, bool(t.curve_dir), t.allow_insecure)
        if is_loopback(w.relay_addr) and not is_loopback(t.weights_addr):
            log.warning(
                "weights.relay_addr %s binds loopback but the trainer is at %s: other "
                "nodes' samplers cannot reach this relay; set weights.relay_addr=tcp://"
                "0.0.0.0:* and weights.relay_host, or weights.fanout=0",
                w.relay_addr,
                t.weights_addr,
            )
        router = new_socket(ctx, zmq.ROUTER, linger_ms=0, limits=SocketLimits(1 << 16, 64))
        if keyed:  # its own pair; it accepts the keys the trainer accepts
            curve_dir = Path(t.curve_dir)
            self._auth = secure_server(ctx, [router], curve_dir, owner=self.sampler_id)
        router.bind(w.relay_addr)
        return router

    def _failed(self, why: str) -> None:
        # The samplers below route around a relay that stopped serving; this one samples on.
        log.error("sampler %s stops relaying: %s", self.sampler_id, why)

    def close(self) -> None:
        self.node.close()
        if self._auth is not None:
            self._auth.stop()


class VersionFollower:
    """The versions this sampler wants, held and received: from the collective group's
    broadcasts (weights.mode collective), else by stream from the relays above it and the
    trainer, on a thread of its own; each taken only as the trainer announced it."""

    def __init__(
        self,
        cfg: Config,
        ctx: zmq.Context,
        sampler_id: str,
        keys: ClientKeys | None,
        relays: Callable[[], dict[str, str]],
        announced: Callable[[], int] | None,
        seed: Image | None = None,
        trusted: Callable[[], Mapping[int, str]] | None = None,
        changed: Callable[[], None] = lambda: None,
    ):
        """`relays()`: the live samplers' relay addresses (the trainer's heartbeats);
        `announced()`: the newest version out, with relays on (None: a lone sampler); `seed`:
        the weights it starts with, the base of its and its children's first delta (other bits
        than the trainer's version 0: full copies). `keys`: its CURVE keys (transport.curve_dir)
        for the trainer, relays and its own relay. `trusted()`: the identity of each version the
        trainer announced, the only manifests taken from any source (stream.client.VersionFetcher).
        `changed()`: a version came in or failed (the sampler's wait looks again at once)."""
        w, t = cfg.weights, cfg.transport
        self.sampler_id, self.trainer_addr, self.fanout = sampler_id, t.weights_addr, w.fanout
        self.relays, self.announced = relays, announced
        curve_dir = Path(t.curve_dir)
        self.receiver = VersionFetcher(
            ctx,
            None if keys is None else SourceKeys(keys, curve_dir, self.trainer_addr, relays),
            t.max_version_bytes,
            w.transfer_timeout_s,
            w.window,
            w.delta,
            trusted,
            reuse=True,  # closed when this follower's thread ends (_run)
        )
        self.held: Image | None = seed
        self.seed, self.trusted, self.changed = seed, trusted, changed
        # weights.mode collective: the versions the group brought (the newest few), and
        # whether it will bring a version (grpo.weights.collective.member.GroupMember.expects)
        self.broadcast: dict[int, Image] = {}
        self.expected: Callable[[int], bool] = lambda version: False
        self._passed_over: dict[str, float] = {}  # relay -> when it last failed a version
        self.failed: dict[int, str] = {}
        self._target = -1
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self.relay: OwnRelay | None = None  # this sampler's, with relays on
        if announced is not None and w.fanout > 0:
            self.relay = OwnRelay(cfg, ctx, sampler_id, keys, self.receiver, seed)
        self.node = self.relay.node if self.relay is not None else None
        self.address = self.relay.address if self.relay is not None else ""  # '' = none
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def want(self, version: int) -> None:
        with self._cond:
            self._target = version
            self._cond.notify_all()

    def forget_failure(self, version: int) -> None:
        """Try `version` again when it is wanted: its source lost it for a reason that passed
        (the trainer restarted from an older state and will publish it again)."""
        with self._cond:
            self.failed.pop(version, None)
            if self._target == version:  # asked again when wanted, not before it is out again:
                self._target = -1  # a failure of an early attempt would stand for the next
            self._cond.notify_all()

    def offer(self, image: Image) -> None:
        """A version the collective group brought (each tensor checked against its manifest):
        used, and held, once the trainer announced its manifest's identity (`_hold`)."""
        with self._cond:
            self.broadcast[image.version] = image
            for old in sorted(self.broadcast)[:-KEPT_BROADCASTS]:
                del self.broadcast[old]
            self._hold(image)
            self._cond.notify_all()
        self.changed()

    def _hold(self, image: Image) -> None:
        """Hold `image` (the next delta's base, served to the samplers below) if it is newer
        and announced: never an unannounced broadcast. The caller holds the lock."""
        if (self.held is None or image.version > self.held.version) and self._current(image):
            self.held = image
            if self.node is not None:
                self.node.source.finished(image)

    def image(self, version: int) -> Image | None:
        """The held version if it is `version` (or, with relays, newer); raises ValueError if
        receiving it failed (with relays: and no newer version is out to receive instead; the
        sources may have moved past a version while a dead relay was waited out)."""
        with self._cond:
            if self._current(sent := self.broadcast.get(version)):
                self._hold(sent)  # announced after it came
                return sent
            held = self.held if self._current(self.held) else None
            if held is not None and (
                held.version == version or (self.announced and held.version > version)
            ):
                return held
            newer = self.announced is not None and self.announced() > version
            if version in self.failed and not newer:
                raise ValueError(self.failed[version])
            return None

    def _next(self) -> int | None:
        with self._cond:
            while not self._closing.is_set():
                if self.announced is not None:
                    self._target = max(self._target, self.announced())
                target = self._target
                held = self.held.version if self._current(self.held) else -1
                sent = self.broadcast.get(target)  # and taken only as announced:
                brought = self._current(sent) or self.expected(target)
                if target >= 0 and target != held and target not in self.failed and not brought:
                    return target
                self._cond.wait(timeout=0.1)
        return None

    def _current(self, image: Image | None) -> bool:
        """Whether `image` is the trainer's version as it is now: announced under that number
        (a resumed trainer's version 8 is not the crashed one's), or this sampler's own start."""
        if image is None or self.trusted is None or image is self.seed:
            return image is not None
        return self.trusted().get(image.version) == image.manifest.identity

    def _run(self) -> None:
        try:
            self._follow()
        finally:
            self.receiver.close()  # its kept sockets: from the thread that used them

    def _follow(self) -> None:
        while (version := self._next()) is not None:
            newer = self.announced is not None  # a relay may have moved past `version`
            before = self.receiver.stats.bytes
            try:
                if self.node is not None:  # its children get each bucket as it is checked
                    image = self.node.receive(version, self._sources(), newer=newer)
                else:
                    image = self.receiver.receive(self._sources(), version, self.held, newer=newer)
            except Exception as e:  # noqa: BLE001 - the sampler must hear why, not hang
                with self._cond:
                    self.failed[version] = str(e) if isinstance(e, ValueError) else repr(e)
                    self._cond.notify_all()
                self.changed()
                continue
            finally:
                now = time.monotonic()
                self._passed_over.update((addr, now) for addr in self.receiver.passed_over)
            got = self.receiver.stats.bytes - before
            log.info(
                "weights: version %d from %s (%d bytes)", image.version, self.receiver.source, got
            )
            with self._cond:
                self.held = image
                self.failed.pop(version, None)
                self._cond.notify_all()
            self.changed()

    def _sources(self) -> list[str]:
        """The relays up the tree, nearest first, then the trainer; a relay that failed a
        version in the last PASS_OVER_S goes after the others (it may be dead: the trainer
        drops it from the tree only after transport.timeout_s of silence)."""
        *ups, trainer = sources(self.sampler_id, self.relays(), self.fanout, self.trainer_addr)
        now = time.monotonic()
        recent = {a for a, t in self._passed_over.items() if now - t < PASS_OVER_S}
        return [*(a for a in ups if a not in recent), *(a for a in ups if a in recent), trainer]

    def close(self) -> None:
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=5)
        if self.relay is not None:
            self.relay.close()
