"""What a weights mode is: a trainer end on rank 0, beside the versions it keeps, and a
receiver on each sampler. The registry (grpo.weights.modes) names every mode; the trainer's
Publisher and the sampler's WeightsInUse talk to these interfaces alone, never to a mode by name."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import zmq

from grpo.config import Config
from grpo.weights.serving import WeightsServer
from grpo.weights.stream.image import Image
from grpo.weights.stream.server import VersionStore
from grpo.weights.version import Version
from grpo.wire.channels import SocketLimits
from grpo.wire.keys import ClientKeys


class Unavailable(ValueError):
    """A version a receiver cannot hand over whole, and why: the sampler keeps its weights."""


# A weights body in a heartbeat: the sampler's (its receiver's `announced`) and the trainer's
# (its end's) each carry at most this many entries under "weights", each key and string bounded;
# the pool and the sampler's endpoint keep it opaque, and only the mode reads it.
MAX_BODY_ENTRIES, MAX_KEY_CHARS, MAX_VALUE_CHARS = 8, 32, 256


def sampler_body(raw: Any) -> dict[str, str] | None:
    """A sampler's weights body as its heartbeat carried it, or None when it is no such body (not
    a dict of at most MAX_BODY_ENTRIES bounded strings)."""
    if not isinstance(raw, dict) or len(raw) > MAX_BODY_ENTRIES:
        return None
    for key, value in raw.items():
        if not (isinstance(key, str) and len(key) <= MAX_KEY_CHARS):
            return None
        if not (isinstance(value, str) and len(value) <= MAX_VALUE_CHARS):
            return None
    return raw


@dataclass(frozen=True)
class Vouched:
    """A live sampler the trainer vouches for (grpo.delivery.pool), as the trainer's end of a
    mode sees it."""

    incarnation: str
    body: dict[str, str]  # its weights body (sampler_body), read by the mode alone
    # Whether other samplers may be told to fetch from it: under CURVE any vouched sampler,
    # else those of transport.relay_samplers (a batch vouches for whoever sent it).
    may_serve: bool


class TrainerLink(Protocol):
    """What rank 0's end of a mode is given at the trainer's start (grpo.delivery.
    trainer_endpoint.ModeLink)."""

    published: int  # the newest version the samplers may already have

    def members(self) -> dict[str, Vouched]:
        """The live samplers the trainer vouches for, from their heartbeats."""
        ...

    def failed(self, cause: str) -> None:
        """A thread of the mode ended: the run stops with its cause."""
        ...


class TrainerEnd:
    """Rank 0's end of a mode. By default it serves nothing and announces nothing (the samplers
    read the trainer's version dirs themselves: weights.mode shared_dir)."""

    def __init__(self, cfg: Config, store: VersionStore | None):
        self.cfg, self.store = cfg, store

    def start(self, link: TrainerLink) -> None:
        """The samplers can be told of versions from now on."""

    def published(self, version: int) -> None:
        """Version `version` is in the store and, where due, in its version dir."""

    def announced(self) -> dict[str, Any]:
        """What every heartbeat of the trainer carries for this mode's receivers, under
        "weights" (bounded by the channel's message size)."""
        return {}

    def close(self) -> None:
        pass


class ServingEnd(TrainerEnd):
    """A trainer end that answers the samplers on transport.weights_addr, on a socket of its
    own (grpo.weights.serving), from its start until it closes: what it answers is `serve`."""

    max_request_bytes: int  # the largest request `serve` takes
    server: WeightsServer | None = None

    def serve(
        self, router: zmq.Socket, closing: threading.Event, failed: Callable[[str], None]
    ) -> None:
        """Answer requests on `router` until `closing`; `failed(cause)` if it ends otherwise."""
        raise NotImplementedError

    def start(self, link: TrainerLink) -> None:
        self.server = WeightsServer(
            self.cfg.transport, self.serve, self.max_request_bytes, link.failed
        )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class SamplerLink(Protocol):
    """What a sampler's receiver takes from its endpoint, which it never sees whole (grpo.
    delivery.sampler_endpoint.ReceiverLink): the channel's context and keys, and what the
    trainer's heartbeats said."""

    run_dir: Path
    sampler_id: str
    ctx: zmq.Context
    keys: ClientKeys | None
    limits: SocketLimits
    seed: Image | None  # version 0 as the sampler holds it (the first delta's base)

    def secure(self, sock: zmq.Socket) -> None:
        """Make a socket to the trainer a CURVE client."""
        ...

    def newest_version(self) -> int:
        """The newest version the trainer announced."""
        ...

    def wait(self, ready: Callable[[], bool], what: str) -> None:
        """Sleep until `ready()` or the sampler stops, named (a stall with its name)."""
        ...

    def wake(self) -> None:
        """Have `wait` look again at once: a version came in, or failed (else it looks again
        only when the trainer next says something, a heartbeat up to transport.heartbeat_s
        away)."""
        ...


class Receiver:
    """A sampler's end of a mode: hands over a published version whole, or raises
    Unavailable saying why."""

    def heard(self, body: dict[str, Any], restarted: bool) -> None:
        """The weights body of a trainer's message (its end's `announced`, unchecked: each
        field is read here), on the sampler channel's thread; `restarted`: the message is the
        first of a new trainer incarnation."""

    def announced(self) -> dict[str, str]:
        """What this sampler's heartbeats carry for the trainer's end (see sampler_body)."""
        return {}

    def get(self, number: int) -> Version | None:
        """Version `number` whole (a newer one where the mode may hand one over), or None when
        the sampler stopped while waiting for it."""
        raise NotImplementedError

    def forget_failure(self, number: int) -> None:
        """Version `number` failed; the trainer restarted and will publish it again."""

    def stats(self) -> dict[str, float]:
        """Totals so far for the metrics rows (bytes received, fallbacks)."""
        return {}

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Mode:
    """One weights.mode: adding a mode is a module that defines one of these, and a line of
    the registry."""

    name: str
    from_memory: bool  # rank 0 keeps versions in a VersionStore and serves them from there
    trainer_end: Callable[[Config, VersionStore | None], TrainerEnd]
    receiver: Callable[[Config, SamplerLink], Receiver]
