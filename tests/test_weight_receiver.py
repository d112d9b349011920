"""What a streamed sync saves on its clock without taking anything on trust: a receiver keeps the
connections of a version received whole for the next one (never a failed source's), and asks
for the first buckets of the next version together with its manifest, reading their answers
only once the manifest is checked and tiles them as asked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from grpo.weights.stream.client import VersionFetcher, largest_frame
from grpo.weights.stream.frames import FULL_COPY
from grpo.weights.stream.image import Image
from grpo.weights.stream.server import PENDING, StreamServer, VersionStore
from tests.test_weight_streaming import MB, model, same


@contextmanager
def counted(source, ctx: zmq.Context) -> Iterator[tuple[str, list[int]]]:
    """A StreamServer for `source`; yields its address and a one-element list counting the
    TCP connections it accepted (a ZeroMQ monitor on its socket)."""
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
    accepted, closing, failures = [0], threading.Event(), []
    server = threading.Thread(target=StreamServer(router, source, closing, failures.append).run)

    def count() -> None:
        while not closing.is_set():
            if monitor.poll(20):
                monitor.recv_multipart()
                accepted[0] += 1

    counter = threading.Thread(target=count)
    server.start()
    counter.start()
    try:
        yield f"tcp://127.0.0.1:{port}", accepted
    finally:
        closing.set()
        server.join(5)
        counter.join(5)
        monitor.close()
    assert not failures


def _receive_three(ctx: zmq.Context, reuse: bool) -> tuple[list[Image], int]:
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    got: list[Image] = []
    with counted(store, ctx) as (addr, accepted):
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5, delta=False, reuse=reuse)
        for v in (1, 2, 3):
            store.add(model(v))
            got.append(rx.receive([addr], v, got[-1] if got else None))
        rx.close()
        time.sleep(0.1)  # the monitor's last events
        return got, accepted[0]


def test_a_receiver_keeps_its_connections_from_one_version_to_the_next() -> None:
    """Three versions over the two connections of the first (manifests, buckets), where a
    receiver without `reuse` makes two for each."""
    ctx = zmq.Context()
    try:
        kept, kept_connections = _receive_three(ctx, reuse=True)
        fresh, fresh_connections = _receive_three(ctx, reuse=False)
    finally:
        ctx.term()
    assert all(same(a, model(v)) for v, a in zip((1, 2, 3), kept, strict=True))
    assert all(same(a, b) for a, b in zip(kept, fresh, strict=True))
    assert (kept_connections, fresh_connections) == (2, 6)


def test_a_source_that_failed_is_connected_to_afresh() -> None:
    """A relay that never answers fails each version, alone or before the trainer; its sockets
    (requests left unanswered on them) are never kept: every attempt connects to it anew. The
    trainer's are kept."""
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    ctx = zmq.Context()
    try:
        silent = ctx.socket(zmq.ROUTER)  # bound, never answers: a relay hung
        relay = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
        monitor = silent.get_monitor_socket(zmq.EVENT_ACCEPTED)
        with counted(store, ctx) as (trainer, accepted):
            rx = VersionFetcher(
                ctx, None, max_bytes=64 * MB, timeout_s=0.3, delta=False, reuse=True
            )
            store.add(model(1))
            with pytest.raises(ValueError, match="could not receive version 1"):
                rx.receive([relay], 1, None)
            held = rx.receive([relay, trainer], 1, None)
            store.add(model(2))
            held = rx.receive([relay, trainer], 2, held)
            rx.close()
            time.sleep(0.1)
            trainer_connections = accepted[0]
        relay_connections = 0
        while monitor.poll(100):
            monitor.recv_multipart()
            relay_connections += 1
        monitor.close()
        silent.close()
    finally:
        ctx.term()
    assert same(held, model(2)) and rx.stats.fallbacks["source failed"] == 2
    # to the relay: a manifest socket for each version 1 attempt, then version 2's and a socket
    # for its buckets asked ahead
    assert (relay_connections, trainer_connections) == (1 + 1 + 2, 2)


class SlowManifest(VersionStore):
    """The trainer's store, answering a manifest request only after `delay_s` (a parked
    request): counts the buckets asked for before the manifest was answered."""

    def __init__(self, delay_s: float):
        super().__init__(keep=2, budget_bytes=64 * MB)
        self.delay_s, self.asked_at, self.answered = delay_s, 0.0, False
        self.buckets_before_manifest = 0

    def manifest(self, version: int, newer: bool = False):
        self.asked_at = self.asked_at or time.monotonic()
        if time.monotonic() - self.asked_at < self.delay_s:
            return PENDING
        self.answered = True
        return super().manifest(version, newer)

    def bucket(self, version: int, base: int, index: int):
        self.buckets_before_manifest += not self.answered
        return super().bucket(version, base, index)


def test_the_first_buckets_are_asked_for_with_the_manifest() -> None:
    """Holding version 1, a receiver asks for version 2's first buckets beside its manifest
    (saving a round trip): the server has them asked for while the manifest is still parked,
    and the version arrives whole and by delta."""
    store = SlowManifest(delay_s=0.5)  # the buckets asked ahead reach it well before
    store.add(model(1))
    store.add(model(2))
    ctx = zmq.Context()
    try:
        with counted(store, ctx) as (addr, _):
            rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5)
            got = rx.receive([addr], 2, model(1))
            rx.close()
    finally:
        ctx.term()
    assert same(got, model(2)) and not rx.stats.fallbacks
    assert store.buckets_before_manifest == min(rx.window, len(got.manifest.buckets)) > 1


def test_buckets_asked_ahead_in_another_tiling_are_not_read() -> None:
    """The trainer's version 2 cut into larger buckets than the version held (weights.bucket_mb
    changed with a restart): the buckets asked ahead went on a socket sized for the held
    tiling, and are given up on; the version comes whole over one sized for its own."""
    held = model(1)
    tensors = [(s.name, s.dtype, s.shape, model(2).arrays[s.name]) for s in held.manifest.specs]
    retiled = Image.build(2, tensors, bucket_bytes=1 << 20)
    assert largest_frame(retiled.manifest) > largest_frame(held.manifest)
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(retiled)
    ctx = zmq.Context()
    try:
        with counted(store, ctx) as (addr, _):
            rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=1, delta=False)
            got = rx.receive([addr], 2, held)
            rx.close()
    finally:
        ctx.term()
    assert got.manifest == retiled.manifest and same(got, retiled)
    assert not rx.stats.fallbacks


def test_a_manifest_of_other_tensors_than_the_held_version_s_is_read_as_its_own() -> None:
    """The specs of the version held are reused only for a manifest listing the same tensors:
    one naming another tensor (another model, an adapter added) is read whole."""
    held = model(1)
    tensors = [(f"renamed.{s.name}", s.dtype, s.shape, model(2).arrays[s.name])
               for s in held.manifest.specs]  # fmt: skip
    other = Image.build(2, tensors, bucket_bytes=40_000)
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(other)
    ctx = zmq.Context()
    try:
        with counted(store, ctx) as (addr, _):
            rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=1)
            got = rx.receive([addr], 2, held)
            rx.close()
    finally:
        ctx.term()
    assert got.manifest == other.manifest and same(got, other)


class Garbling(VersionStore):
    """The trainer's store, its full copies arriving with a bit flipped in their payload (the
    frames otherwise intact: a full copy's frame checksum covers its header alone) the first
    `times` times they are asked for."""

    def __init__(self, times: int):
        super().__init__(keep=2, budget_bytes=64 * MB)
        self.times = times

    def bucket(self, version: int, base: int, index: int):
        frames = super().bucket(version, base, index)
        if self.times and base == FULL_COPY and isinstance(frames, list):
            self.times -= 1
            payload = bytearray(frames[1])
            payload[len(payload) // 2] ^= 1
            return [frames[0], payload]
        return frames


def test_a_full_copy_that_fails_its_checksum_is_asked_again_then_its_source_passed_over() -> None:
    """A full copy corrupted on the way is caught by its bucket's checksum where it is staged
    (checked once: the frame checksum does not cover it) and asked for again; a source whose
    full copies keep failing is passed over after MAX_CORRUPT, for the next."""
    from grpo.weights.stream.client import MAX_CORRUPT

    once, always, clean = Garbling(times=1), Garbling(times=1000), Garbling(times=0)
    for store in (once, always, clean):
        store.add(model(1))
    ctx = zmq.Context()
    try:
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5, delta=False)
        with counted(once, ctx) as (addr, _):
            got = rx.receive([addr], 1, None)
        assert same(got, model(1)) and rx.stats.fallbacks["corrupt bucket"] == 1
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5, delta=False)
        with counted(always, ctx) as (relay, _), counted(clean, ctx) as (trainer, _):
            got = rx.receive([relay, trainer], 1, None)
    finally:
        ctx.term()
    assert same(got, model(1)) and rx.passed_over == [relay]
    assert rx.stats.fallbacks["corrupt bucket"] == MAX_CORRUPT
