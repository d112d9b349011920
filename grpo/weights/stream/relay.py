"""Fan-out: samplers pass versions on to each other, so the trainer sends each version about once
whatever the number of samplers.

The live samplers, sorted by id, form a tree of `fanout` children per node (sampler i's parent is
sampler (i - 1) // fanout; sampler 0's is the trainer). Each sampler receives from its parent,
then its grandparent and so on up to the trainer when one fails to answer for
weights.transfer_timeout_s (a relay that died is routed around, and the next version's tree no
longer holds it), and serves every bucket to its own children as soon as it has checked it: a
version flows down the tree bucket by bucket, pipelined, not version by version. A sampler that
joins late, or restarts, catches up from its parent like any other.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from grpo.weights.stream.frames import FULL_COPY, Bucket, Manifest
from grpo.weights.stream.image import Image, Staging, encode_image_bucket
from grpo.weights.stream.server import PENDING


def upstream(me: str, relays: dict[str, str], fanout: int) -> list[str]:
    """The addresses `me` receives from, nearest first (the trainer's comes after them):
    its ancestors in the tree of the live samplers in `relays` (sampler id -> relay address)."""
    order = sorted(relays)
    if fanout < 1 or me not in order:
        return []
    chain, i = [], order.index(me)
    while i > 0:
        i = (i - 1) // fanout
        chain.append(relays[order[i]])
    return chain


class RelaySource:
    """What a relaying sampler serves: its newest complete version, and the one it is receiving
    bucket by bucket (a bucket not in yet is held back: the request is parked). A bucket is
    passed on as it came when the child asks for the same base (or it came as full copies);
    else it is encoded again from the checked tensors, once per base: every child asking
    with that base gets the same frames, however many ask."""

    def __init__(self, delta: bool = True):
        self.delta = delta
        self._lock = threading.Lock()
        self.held: Image | None = None
        self.previous: Image | None = None  # the held one before: a base children still hold
        self.staging: Staging | None = None
        self._received: dict[int, tuple[int, list[Any]]] = {}  # index -> (base, frames)
        # (manifest identity, base, index) -> frames encoded here, for what it holds or takes in
        self._encoded: dict[tuple[str, int, int], list[Any]] = {}
        self.progress = 0  # buckets taken in (grpo.weights.stream.server.VersionSource)

    def started(self, staging: Staging) -> None:
        with self._lock:
            self.staging, self._received = staging, {}
            self._forget_encodings()

    def took(self, index: int, frames: list[Any], bucket: Bucket) -> None:
        with self._lock:
            self._received[index] = (bucket.base, frames)
            self.progress += 1

    def finished(self, image: Image) -> None:
        with self._lock:
            self.previous, self.held = self.held, image
            self.staging, self._received = None, {}
            self._forget_encodings()

    def _forget_encodings(self) -> None:
        """Keep only the encodings of what this relay still serves (lock held)."""
        self._encoded = {k: v for k, v in self._encoded.items() if k[0] in self._serves()}

    def _serves(self) -> set[str]:
        return {x.manifest.identity for x in (self.held, self.staging) if x is not None}

    def manifest(self, version: int, newer: bool = False) -> Manifest | None | object:
        """The held version's, else the one coming in (bucket by bucket), if it is `version`
        or (`newer`) after it."""
        with self._lock:
            for have in (self.held, self.staging):
                if have is not None and (
                    have.manifest.version == version or (newer and have.manifest.version > version)
                ):
                    return have.manifest
            return PENDING if self._coming(version) else None

    def _coming(self, version: int) -> bool:
        """Whether `version` may still come here: newer than the one this relay holds or is
        receiving (it never goes back to an older one). A child may hear of a version before
        its parent does: its request waits for the parent to hear of it too. Lock held."""
        newest = [x.manifest.version for x in (self.held, self.staging) if x is not None]
        return max(newest, default=-1) < version

    def bucket(self, version: int, base: int, index: int) -> list[Any] | None | object:
        with self._lock:
            held, staging, received = self.held, self.staging, self._received.get(index)
            coming = self._coming(version)
        if held is not None and held.version == version:
            return self._encode(held, index, base)
        if staging is None or staging.manifest.version != version:
            return PENDING if coming else None
        if received is None:
            return PENDING
        came_with, frames = received
        if came_with in (base, FULL_COPY):
            return frames
        return self._encode(Image(staging.manifest, staging.arrays, staging.flats), index, base)

    def _encode(self, image: Image, index: int, base: int) -> list[Any]:
        """Bucket `index` of `image` against the child's base, if this relay holds it."""
        key = (image.manifest.identity, base, index)
        with self._lock:
            if (frames := self._encoded.get(key)) is not None:
                return frames
        old = next((i for i in (self.held, self.previous) if i and i.version == base), None)
        if base != FULL_COPY and (old is None or old is image):
            raise KeyError("no such base")
        frames, _ = encode_image_bucket(image, index, old, self.delta)
        with self._lock:
            if key[0] in self._serves():
                self._encoded[key] = frames
        return frames


def relay_members(status: dict[str, Any]) -> dict[str, str]:
    """The live samplers' relay addresses from the trainer's heartbeat, checked."""
    relays = status.get("relays")
    if not isinstance(relays, dict):
        return {}
    return {k: v for k, v in relays.items() if isinstance(k, str) and isinstance(v, str)}


def sources(me: str, relays: dict[str, str], fanout: int, trainer: str) -> Sequence[str]:
    return [*upstream(me, relays, fanout), trainer]


MAX_ANNOUNCED = 1024  # versions a heartbeat may name (the trainer holds weights.keep_bases)


def announced_manifests(status: dict[str, Any]) -> dict[int, str] | None:
    """Version -> manifest identity (SHA-256 hex) from the trainer's heartbeat, checked; None
    when the heartbeat names none (the trainer serves no versions from memory)."""
    named = status.get("manifests")
    if not isinstance(named, dict) or len(named) > MAX_ANNOUNCED:
        return None
    out = {}
    for version, identity in named.items():
        numbered = isinstance(version, str) and version.isdigit() and len(version) <= 18
        if numbered and isinstance(identity, str) and len(identity) == 64:
            out[int(version)] = identity
    return out
