"""Every way a streamed transfer can go wrong ends within a bound and falls through to the next
source (weights.mode: stream): a relay that answers full-copy requests with deltas, an address
that is not one, a source whose keys cannot be had."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import zmq

from bench.weight_fanout import MAX_BYTES, QUICK, synthetic
from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.image import Image, encode_image_bucket
from grpo.weights.stream.server import VersionStore
from tests.test_weight_streaming import serving


class DeltaOnly:
    """A relay that answers every bucket request, full copies included, with a delta from its
    own version 0, which is not the receiver's: every one fails its checksums."""

    progress = 0

    def __init__(self, image: Image, base: Image):
        self.image, self.base = image, base

    def manifest(self, version: int, newer: bool = False):
        return self.image.manifest if version == self.image.version else None

    def bucket(self, version: int, base: int, index: int):
        return encode_image_bucket(self.image, index, self.base)[0]


def _receive_in_time(rx: VersionFetcher, sources: list[str], held: Image | None) -> list:
    """receive() in a thread: [image], or [] if it had not returned after 20 s."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(rx.receive(sources, 1, held)), daemon=True)
    thread.start()
    thread.join(20)
    return got


def test_a_relay_answering_full_copy_requests_with_deltas_is_left_for_the_next_source() -> None:
    """It used to keep its child asking again for ever (thousands of loops and warnings a
    second): the full copy asked for must come as one, or the source has failed."""
    real, relay_base = synthetic(1, QUICK), synthetic(50, QUICK)
    held = Image(synthetic(0, QUICK).manifest, synthetic(0, QUICK).arrays)
    relay_base = Image(synthetic(0, QUICK).manifest, relay_base.arrays)  # version 0, other bits
    store = VersionStore(keep=2, budget_bytes=1 << 30)
    store.add(real)
    ctx = zmq.Context()
    try:
        with serving(DeltaOnly(real, relay_base), ctx) as relay, serving(store, ctx) as trainer:
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5)
            got = _receive_in_time(rx, [relay, trainer], held)
    finally:
        ctx.destroy(linger=0)  # sockets a broken receiver left open, too
    assert got and got[0].manifest == real.manifest, "still looping on the relay"
    # each bucket's delta failed once (16 buckets), then the first full copy asked for came as a
    # delta: the relay failed; the trainer holds no version 0 (base not kept: full copies)
    assert rx.stats.fallbacks["delta mismatch"] <= len(real.manifest.buckets), rx.stats.fallbacks
    assert rx.stats.fallbacks["source failed"] == 1 and rx.passed_over == [relay]


def test_an_address_that_is_not_one_and_missing_keys_fall_through_to_the_trainer() -> None:
    real = synthetic(1, QUICK)
    store = VersionStore(keep=2, budget_bytes=1 << 30)
    store.add(real)

    def secure(sock: zmq.Socket, addr: str) -> None:  # a relay whose key file is missing
        if addr != trainer:
            raise FileNotFoundError(f"no key for {addr}")

    ctx = zmq.Context()
    try:
        with serving(store, ctx) as trainer:
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5)
            got = _receive_in_time(rx, ["tcp://127.0.0.1:notaport", "nonsense", trainer], None)
            keyed = VersionFetcher(ctx, secure, MAX_BYTES, timeout_s=5)
            keyed_got = _receive_in_time(keyed, ["tcp://127.0.0.1:1", trainer], None)
    finally:
        ctx.destroy(linger=0)  # sockets a broken receiver left open, too
    assert got and got[0].manifest == real.manifest
    assert rx.passed_over == ["tcp://127.0.0.1:notaport", "nonsense"]
    assert keyed_got and keyed.passed_over == ["tcp://127.0.0.1:1"]


def test_a_streamed_version_is_awaited_in_the_receiving_phase_not_the_idle_one() -> None:
    """While a version comes in, the sampler's phase is `receiving weights`, ticked per bucket:
    a transfer that stops is a stall with that name. (The wait used to switch to the idle
    `waiting`, which no stall limit watches.)"""
    from grpo.delivery.sampler_endpoint import ReceiverLink, SamplerEndpoint, TrainerStatus
    from grpo.runtime.progress import ACTIVITY, RECEIVING
    from grpo.weights.in_use import WeightsInUse
    from grpo.weights.modes.stream import StreamReceiver

    class Follower:
        def __init__(self) -> None:
            self.receiver = VersionFetcher(zmq.Context.instance(), None, MAX_BYTES, timeout_s=1)
            self.asked = 0

        def want(self, version: int) -> None:
            pass

        def image(self, version: int) -> Image | None:
            self.asked += 1
            phases.append(ACTIVITY.snapshot().phase)
            self.receiver.stats.progress += 1  # a bucket came in
            return synthetic(version, QUICK) if self.asked == 3 else None

    phases: list[str] = []
    endpoint = SamplerEndpoint.__new__(SamplerEndpoint)  # only what wait_until reads
    endpoint.status, endpoint.stopped = TrainerStatus(), threading.Event()
    endpoint._news, endpoint._sync, endpoint.on_wait = threading.Event(), lambda: None, None
    endpoint._news.set()  # no 5 s waits between the checks
    weights = WeightsInUse.__new__(WeightsInUse)
    receiver = StreamReceiver.__new__(StreamReceiver)  # as connect makes it, but this follower
    receiver.follower = Follower()  # type: ignore[assignment]
    receiver.wait = ReceiverLink(endpoint, Path(), seed=None).wait
    weights.receiver, weights.trainer, weights.failed_reloads = receiver, endpoint, {}
    weights.consumers = []
    weights.version = 0

    def wake() -> None:
        while weights.version == 0:
            endpoint._news.set()

    threading.Thread(target=wake, daemon=True).start()
    weights.reload(1)
    assert weights.version == 1 and phases == [RECEIVING] * 3, phases


@pytest.mark.parametrize("staleness, sync", [(0, 1), (2, 1), (3, 2), (5, 1)])
def test_the_trainer_keeps_every_version_a_restarted_sampler_may_ask_for(staleness, sync):
    """A sampler restarted at staleness 2 used to ask for a version the trainer no longer held
    (it kept weights.keep_bases = 2): its next batch, seq >= the trainer's version V, may need
    any published version from required_version(V) up, whatever keep_bases and the memory
    budget say."""
    from grpo.config import load_config
    from grpo.core.staleness import required_version
    from grpo.weights.publisher import new_store

    cfg = load_config(None, [
        "weights.mode=stream", "transport.weights_addr=tcp://127.0.0.1:5557",
        f"train.max_staleness={staleness}", f"train.sync_interval={sync}",
        "weights.keep_bases=1", "weights.base_memory_mb=0.001", "train.keep_versions=16",
    ])  # fmt: skip
    store = new_store(cfg)
    for version in range(0, 13, sync):
        store.add(synthetic(version, QUICK))
        oldest = required_version(version, staleness, sync)
        assert set(range(oldest, version + 1, sync)) <= set(store.images), (version, oldest)


class Swelling:
    """A relay that serves the real manifest, then answers each bucket request with one frame
    of 32 MiB: far more than any bucket of that version can hold."""

    progress = 0

    def __init__(self, image: Image):
        self.image = image

    def manifest(self, version: int, newer: bool = False):
        return self.image.manifest if version == self.image.version else None

    def bucket(self, version: int, base: int, index: int):
        return [b"\0" * 8, bytes(32 << 20)]


def test_a_frame_larger_than_the_version_allows_is_refused_before_it_is_held() -> None:
    """The bucket socket takes no frame larger than the manifest's largest bucket (it was
    transport.max_version_bytes, 1 TiB by default): the relay's 32 MiB frames never reach the
    receiver, which passes the relay over for its silence and takes the trainer's version."""
    from grpo.weights.stream.client import largest_frame

    real = synthetic(1, QUICK)
    assert largest_frame(real.manifest) < 1 << 20
    store = VersionStore(keep=2, budget_bytes=1 << 30)
    store.add(real)
    ctx = zmq.Context()
    try:
        with serving(Swelling(real), ctx) as relay, serving(store, ctx) as trainer:
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=1)
            got = _receive_in_time(rx, [relay, trainer], None)
    finally:
        ctx.destroy(linger=0)
    assert got and got[0].manifest == real.manifest
    assert rx.passed_over == [relay] and "corrupt bucket" not in rx.stats.fallbacks, (
        rx.stats.fallbacks  # a corrupt bucket: the frame was taken in, then refused
    )


def test_a_version_kept_with_a_state_comes_back_as_itself_and_a_tampered_one_is_refused(
    tmp_path,
) -> None:
    """What a trainer's state keeps of its versions (grpo.weights.publisher.keep_for_resume)
    reads back with the same identity; a tensor changed on disk is refused by its checksum."""
    from grpo.weights.stream.image import load_image, save_image

    image = synthetic(3, QUICK)
    path = tmp_path / "v000003.safetensors"
    save_image(image, path)
    back = load_image(path, MAX_BYTES)
    assert back.manifest.identity == image.manifest.identity
    assert all((back.arrays[k] == image.arrays[k]).all() for k in image.arrays)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1  # the last byte of the last tensor
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_image(path, MAX_BYTES)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a saved version"):
        load_image(path, MAX_BYTES)


def test_a_kept_version_that_does_not_read_back_stops_the_resume_saying_how_to_go_on(
    tmp_path,
) -> None:
    """A state's kept version changed on disk, or kept by code that wrote another manifest (one
    with a checksum per tensor): one line naming the file and the way on, nothing half added."""
    import json

    from safetensors.numpy import save_file

    from grpo.weights.publisher import restore_versions
    from grpo.weights.stream.image import save_image

    versions = tmp_path / "versions"
    versions.mkdir()
    save_image(synthetic(2, QUICK), versions / "v000002.safetensors")
    old = synthetic(3, QUICK)
    body = old.manifest.to_body()
    body["specs"] = [[*spec, 0] for spec in body["specs"]]  # a digest per tensor, as before
    save_file(old.arrays, str(versions / "v000003.safetensors"),
              metadata={"manifest": json.dumps(body)})  # fmt: skip
    store = VersionStore(keep=4, budget_bytes=1 << 30)
    with pytest.raises(ValueError, match=r"v000003.*not a saved version.*remove .*versions"):
        restore_versions(store, versions, MAX_BYTES)
    assert list(store.images) == [2]  # the one before it, read whole; nothing of the other


def test_a_forgotten_failure_is_not_tried_again_before_the_version_is_wanted() -> None:
    """A restarted trainer has not published version 3 yet when a lone sampler asks for it: the
    sampler forgets that failure (grpo.weights.in_use) and waits for 3 to be announced again.
    Its follower used to try 3 again at once, fail again, and report that stale failure when the
    sampler asked for 3 once it was out: the sampler stopped (a chaos run in collective mode)."""
    import time

    from grpo.config import load_config
    from grpo.weights.stream.follower import VersionFollower

    store = VersionStore(keep=4, budget_bytes=1 << 30)
    ctx = zmq.Context()
    with serving(store, ctx) as addr:
        cfg = load_config(None, ["weights.mode=stream", f"transport.weights_addr={addr}",
                                 "weights.transfer_timeout_s=2"])  # fmt: skip
        follower = VersionFollower(cfg, ctx, "sampler-0", None, dict, None)
        try:
            follower.want(3)
            deadline = time.monotonic() + 10
            with pytest.raises(ValueError, match="no version 3"):
                while follower.image(3) is None and time.monotonic() < deadline:
                    time.sleep(0.02)
            follower.forget_failure(3)
            time.sleep(0.5)  # the trainer is still on its way to version 3
            store.add(synthetic(3, QUICK))
            follower.want(3)
            while (got := follower.image(3)) is None and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            follower.close()
    ctx.term()
    assert got is not None and got.version == 3
