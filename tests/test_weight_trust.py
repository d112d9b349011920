"""The trainer is the root of trust of streamed weights (weights.mode: stream): a sampler takes a
version from any source only when its manifest has the identity the trainer announced for it
over the control channel (grpo.weights.stream.frames.Manifest.identity), and then each bucket
only when it matches the manifest's checksum. A relay can forward a version, never originate
one: a forged version, one the trainer never announced (a higher number, another incarnation's)
or the trainer's tensors cut into other buckets are refused, and the next source is tried."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import zmq
from blake3 import blake3

from bench.weight_fanout import MAX_BYTES, QUICK, synthetic
from grpo.delivery.sampler_endpoint import SamplerEndpoint, TrainerStatus
from grpo.weights.modes.stream import KEPT_IDENTITIES, StreamReceiver
from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.frames import bucket_sum
from grpo.weights.stream.image import Image
from grpo.weights.stream.relay import announced_manifests
from grpo.weights.stream.server import VersionStore
from grpo.wire.codec import Message
from tests.test_weight_streaming import serving
from tests.xxh3_forgery import forged_image


def _store(*images: Image) -> VersionStore:
    store = VersionStore(keep=8, budget_bytes=1 << 30)
    for image in images:
        store.add(image)
    return store


def _forged(version: int) -> Image:
    """A self-consistent version `version` of other weights: every checksum matches its bytes."""
    other = synthetic(version + 1000, QUICK)
    return Image(replace(other.manifest, version=version), other.arrays, other.flats)


def _receive(fake: VersionStore, trainer: VersionStore, announced: dict[int, str], **kw):
    ctx = zmq.Context()
    try:
        with serving(fake, ctx) as relay, serving(trainer, ctx) as root:
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=1, trusted=lambda: announced)
            t0 = time.monotonic()
            got = rx.receive([relay, root], 1, None, **kw)
            return got, rx, time.monotonic() - t0
    finally:
        ctx.term()


def test_identity_covers_every_field_of_the_manifest() -> None:
    m = synthetic(1, QUICK).manifest
    spec = m.specs[0]
    others = [
        replace(m, version=2),
        replace(m, adapter=True),
        replace(m, sums=(("1" if m.sums[0][0] == "0" else "0") + m.sums[0][1:], *m.sums[1:])),
        replace(m, specs=(replace(spec, name="other"), *m.specs[1:])),
        replace(m, specs=(replace(spec, dtype="int32"), *m.specs[1:])),
        replace(m, specs=(replace(spec, shape=(1, spec.size)), *m.specs[1:])),
        Image.build(
            1,
            [(s.name, s.dtype, s.shape, np.zeros(s.size, s.bits)) for s in m.specs],
            QUICK.bucket_bytes,
        ).manifest,  # fmt: skip
        replace(m, buckets=((0, len(m.specs)),), sums=m.sums[:1]),  # the same tensors, one bucket
    ]
    assert len({m.identity, *(o.identity for o in others)}) == len(others) + 1


def test_a_bucket_s_digest_is_blake3_of_its_tensors_bytes_back_to_back() -> None:
    """The known answers of BLAKE3 (its reference test vector for no input), and a bucket of two
    float tensors summed as their bytes back to back, whatever the split."""
    empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert bucket_sum([]) == bucket_sum([b""]) == empty
    a, b = np.arange(1000, dtype=np.float32), np.full(24, 1e4, np.float32)
    whole = np.concatenate([a, b])
    assert bucket_sum([a, b]) == bucket_sum([whole]) == blake3(whole.tobytes()).hexdigest()
    assert bucket_sum([a, b]) != bucket_sum([b, a])


def test_a_forged_version_from_a_relay_is_refused_and_the_trainer_s_taken() -> None:
    """The fake relay's version 1 passes every checksum of its own manifest (which is how it
    was loaded before): its identity is not the one announced."""
    real = synthetic(1, QUICK)
    got, rx, _ = _receive(_store(_forged(1)), _store(real), {1: real.manifest.identity})
    assert got.manifest == real.manifest
    assert all(np.array_equal(got.arrays[k], real.arrays[k]) for k in real.arrays)
    assert rx.stats.fallbacks["source failed"] == 1 and rx.source != rx.passed_over[0]


def test_a_relay_s_xxh3_equal_buckets_under_the_trainer_s_identity_are_refused() -> None:
    """Issue 62, finding 1: the trainer's own manifest (the announced identity), its buckets'
    bytes forged to the same XXH3-64 (most floats 1e4). The bucket digests are BLAKE3: refused,
    and the trainer's version taken."""
    real = synthetic(1, QUICK)
    got, rx, _ = _receive(_store(forged_image(real)), _store(real), {1: real.manifest.identity})
    assert got.manifest == real.manifest
    assert all(np.array_equal(got.arrays[k], real.arrays[k]) for k in real.arrays)
    assert rx.stats.fallbacks["source failed"] == 1


class _Trickling(VersionStore):
    """A relay's source that answers each bucket just within the silence bound (1 s here)."""

    def bucket(self, version: int, base: int, index: int):
        time.sleep(0.8)
        return super().bucket(version, base, index)


def test_a_relay_that_trickles_within_the_silence_bound_is_passed_over() -> None:
    """Issue 62, read-only finding "a slow relay that is never passed over": each answer reset
    the silence timer, so a relay sending a bucket every 0.8 s held the sampler 16 x 0.8 s on a
    version of 16 buckets. A relay now gets timeout_s plus the version's bytes at
    RELAY_FLOOR_BYTES_PER_S (2 MiB: 1.25 s here), then the trainer serves it."""
    real = synthetic(1, QUICK)
    slow = _Trickling(keep=8, budget_bytes=1 << 30)
    slow.add(real)
    got, rx, seconds = _receive(slow, _store(real), {1: real.manifest.identity})
    assert all(np.array_equal(got.arrays[k], real.arrays[k]) for k in real.arrays)
    assert rx.stats.fallbacks["source failed"] == 1 and rx.source != rx.passed_over[0]
    assert seconds < 1.25 + 2.5, seconds  # the floor, then the trainer's quick answers


def test_a_version_the_trainer_never_announced_is_refused() -> None:
    """A relay handing out version 10^12 to a receiver that takes newer versions (relays on):
    refused, after waiting for an announcement at most timeout_s."""
    real = synthetic(1, QUICK)
    got, rx, took = _receive(_store(_forged(10**12)), _store(real), {1: real.manifest.identity},
                             newer=True)  # fmt: skip
    assert got.version == 1 and got.manifest == real.manifest
    assert rx.stats.fallbacks["source failed"] == 1 and took < 3, took


def test_the_trainer_s_tensors_in_another_tiling_are_refused_and_the_trainer_still_serves() -> None:
    """Staging is matched by the whole identity: a relay that cut the same tensors into other
    buckets fails, and the receiver starts over with the trainer's tiling."""
    real = synthetic(1, QUICK)
    tensors = [(s.name, s.dtype, s.shape, real.arrays[s.name]) for s in real.manifest.specs]
    retiled = Image.build(1, tensors, QUICK.bucket_bytes * 2)
    assert retiled.manifest.specs == real.manifest.specs != ()  # the same tensors, other buckets
    assert retiled.manifest.buckets != real.manifest.buckets
    got, rx, _ = _receive(_store(retiled), _store(real), {1: real.manifest.identity})
    assert got.manifest == real.manifest and rx.stats.fallbacks["source failed"] == 1


def test_no_source_at_all_without_the_announcement() -> None:
    real = synthetic(1, QUICK)
    with pytest.raises(ValueError, match="which the trainer has not announced"):
        _receive(_store(real), _store(real), {})


def test_the_sampler_keeps_the_announced_identities_of_the_trainer_incarnation_it_follows():
    """From the trainer's heartbeats' weights body, which the endpoint hands the stream
    receiver: checked; remembered after the trainer drops a version from memory (a relay may
    hold it); forgotten when the trainer restarts (its version 8 is not the crashed one's)."""
    assert announced_manifests({"manifests": {"1": "a" * 64, "x": "b" * 64, "2": "short"}}) == {
        1: "a" * 64
    }
    assert announced_manifests({"manifests": "nope"}) is None
    endpoint = SamplerEndpoint.__new__(SamplerEndpoint)  # only what _heard reads and writes
    endpoint.status, endpoint.sampler_id = TrainerStatus(), "sampler-0"
    endpoint.stopped, endpoint._news = threading.Event(), threading.Event()
    receiver = StreamReceiver.__new__(StreamReceiver)  # what heard reads and writes, no socket
    receiver.relays, receiver.manifests = {}, {}
    endpoint.receiver = receiver

    def heartbeat(incarnation: str, manifests: dict[str, str]) -> None:
        body = {"version": 0, "incarnation": incarnation, "weights": {"manifests": manifests}}
        endpoint._heard(Message("heartbeat", body))

    heartbeat("run-a", {"7": "a" * 64, "8": "b" * 64})
    heartbeat("run-a", {"8": "b" * 64})
    assert receiver.manifests == {7: "a" * 64, 8: "b" * 64}
    heartbeat("run-b", {"6": "c" * 64})  # resumed from version 6
    assert receiver.manifests == {6: "c" * 64}
    heartbeat("run-b", {str(v): "d" * 64 for v in range(KEPT_IDENTITIES + 5)})
    kept = receiver.manifests
    assert len(kept) == KEPT_IDENTITIES and max(kept) == KEPT_IDENTITIES + 4


def test_every_heartbeat_of_a_streaming_trainer_names_the_versions_it_holds(tmp_path):
    """What the trainer's publisher adds to each heartbeat (grpo.delivery.trainer_endpoint
    sends it whole): in weights.mode stream, the identity of every version it holds."""
    from grpo.config import load_config
    from grpo.weights.publisher import Publisher

    def publisher(mode: str) -> Publisher:
        overrides = [f"weights.mode={mode}", "transport.weights_addr=tcp://127.0.0.1:1",
                     f"output_dir={tmp_path}"]  # fmt: skip
        return Publisher(load_config(None, overrides), tokenizer=None)

    stream = publisher("stream")
    assert stream.store is not None
    for v in (0, 1):
        stream.store.add(synthetic(v, QUICK))
    beat = stream.announced()  # the heartbeat's weights body
    assert announced_manifests(beat) == {v: synthetic(v, QUICK).manifest.identity for v in (0, 1)}
    assert "manifests" not in publisher("files").announced()  # versions on disk


# ------------------------------------------------------------------ a run with an impostor


class Forger:
    """A fake relay's source: any version asked for, made of the trainer's version 0 with the
    first element of every tensor changed, under a manifest of its own whose every checksum
    matches its bytes (what a receiver checked before the trainer's identity)."""

    progress = 0

    def __init__(self, base: Image):
        self.base, self.forged = base, {}

    def image(self, version: int) -> Image:
        if version not in self.forged:
            tensors = []
            for s in self.base.manifest.specs:
                bits = self.base.arrays[s.name].copy()
                bits[0] ^= 1
                tensors.append((s.name, s.dtype, s.shape, bits))
            self.forged[version] = Image.build(version, tensors, 1 << 20)
        return self.forged[version]

    def manifest(self, version: int, newer: bool = False):
        return self.image(version).manifest

    def bucket(self, version: int, base: int, index: int):
        from grpo.weights.stream.image import encode_image_bucket

        return encode_image_bucket(self.image(version), index, None)[0]


def _initial_weights(ctx: zmq.Context, addr: str, procs: list) -> Image:
    """The trainer's version 0, once it holds it (it binds before it copies the weights)."""
    deadline = time.monotonic() + 300
    while True:
        try:
            return VersionFetcher(ctx, None, MAX_BYTES, timeout_s=60).receive([addr], 0, None)
        except ValueError:
            assert time.monotonic() < deadline and procs[0].poll() is None, "no version 0"
            time.sleep(0.5)


class Hostile(Forger):
    """A hostile relay's source, one trick per request for a manifest, in turn: a forged
    version; a version far in the future; the trainer's real manifest (fetched from it) with
    buckets that fail their checksums; the real manifest and half the real buckets, then
    silence (it stops answering anyone for twice weights.transfer_timeout_s)."""

    FUTURE = 10**12

    def __init__(self, base: Image, trainer: str, ctx: zmq.Context, stall_s: float):
        super().__init__(base)
        self.receiver = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=10)
        self.trainer, self.stall_s, self.real = trainer, stall_s, {}
        self.asked, self.tricks = 0, {}  # version -> the trick its manifest request got
        self.played: Counter[str] = Counter()  # each trick's bytes as they went out

    def _real(self, version: int) -> Image | None:
        if version not in self.real:
            try:
                self.real[version] = self.receiver.receive([self.trainer], version, None)
            except ValueError:
                return None
        return self.real[version]

    def manifest(self, version: int, newer: bool = False):
        trick = self.tricks[version] = self.asked % 4
        real = self._real(version) if trick in (2, 3) else None
        if trick in (2, 3) and real is None:  # the trainer was slow to answer: forge instead,
            self.tricks[version] = 0  # and play this trick at the next request
            self.played["forged"] += 1
            return self.image(version).manifest
        self.asked += 1
        if trick == 1:
            self.played["future"] += 1
            return self.image(self.FUTURE).manifest
        if real is None:
            self.played["forged"] += 1
            return self.image(version).manifest
        return real.manifest

    def bucket(self, version: int, base: int, index: int):
        from grpo.weights.stream.image import encode_image_bucket

        real, trick = self.real.get(version), self.tricks.get(version)
        if real is None or trick not in (2, 3):
            return super().bucket(version, base, index)
        if trick == 2:  # well-formed frames of a full copy whose tensors are not the manifest's
            self.played["corrupt"] += 1
            flipped = Image(real.manifest, {k: a ^ 1 for k, a in real.arrays.items()})
            return encode_image_bucket(flipped, index, None)[0]
        frames = encode_image_bucket(real, index, None)[0]
        if index >= len(real.manifest.buckets) // 2:
            self.played["stalled"] += 1
            time.sleep(self.stall_s)  # mid-version, the whole relay stops
        return frames


REFUSALS = {
    "forged": "is not the one the trainer announced",
    "future": f"version {Hostile.FUTURE}",
    "corrupt": "does not match its checksum",
    "stalled": "nothing for",
    "unresolvable": "cannot connect",
}


# Extended tier: each of its tricks is refused in CI by the unit tests above (a forged version,
# XXH3-equal buckets, a version never announced, another tiling, a trickle), over real sockets.
@pytest.mark.extended
def test_a_hostile_relay_in_a_stream_run_gets_nothing_loaded_and_the_run_ends(
    tmp_path, tiny_model_dir
):
    """Two samplers relaying (fanout 1: sampler-1 receives from sampler-0, then the trainer;
    without CURVE their ids are listed in transport.relay_samplers). A peer without CURVE
    heartbeats under sampler-0's id, many times a second, naming its own
    relay (or an address that does not resolve), which serves forged versions, a version far
    in the future, corrupt buckets and stalls mid-version (Hostile), while it floods the
    trainer's weight server with requests it never reads. sampler-1 asks it first and refuses
    each trick within its bound; every version it loads comes from a real source (a relay
    passes on the trainer's bytes, never its own), and the run ends normally."""
    from grpo.weights.stream.server import BUCKET, MANIFEST
    from grpo.wire import messages
    from grpo.wire.codec import encode_message
    from tests.conftest import free_port, transport_overrides
    from tests.test_chaos import finish, start, wait_for
    from tests.test_integration import tiny_config
    from tests.test_weight_stream_runs import RECEIVED

    config = tiny_config(tmp_path, tiny_model_dir, train={"total_steps": 12, "num_ranks": 1})
    weights_addr = f"tcp://127.0.0.1:{free_port()}"
    overrides = [*transport_overrides(timeout_s=20), "rollout.num_samplers=2",
                 "weights.mode=stream", f"transport.weights_addr={weights_addr}",
                 "weights.fanout=1", "weights.transfer_timeout_s=2",
                 "transport.relay_samplers=[sampler-0,sampler-1]"]  # fmt: skip
    episodes = next(o.split("=", 1)[1] for o in overrides if o.startswith("transport.episodes"))
    unresolvable = "tcp://no-such-host.invalid:5"
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "s0", "s1")}
    procs = [start("trainer", config, overrides, logs["trainer"])]
    ctx, stop, flooded = zmq.Context(), threading.Event(), [0]
    try:
        base = _initial_weights(ctx, weights_addr, procs)
        hostile = Hostile(base, weights_addr, ctx, stall_s=4)
        with serving(hostile, ctx) as fake:

            def impostor() -> None:
                push = ctx.socket(zmq.PUSH)
                push.setsockopt(zmq.LINGER, 0)
                push.connect(episodes)
                beat = 0
                while not stop.wait(0.02):
                    beat += 1
                    relay = unresolvable if beat % 5 == 0 else fake
                    body = {"sampler_id": "sampler-0", "weights": {"relay": relay}}
                    push.send_multipart(encode_message(Message(messages.HEARTBEAT, body)))
                push.close()

            def flood() -> None:  # requests the trainer answers and nobody reads
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.setsockopt(zmq.SNDTIMEO, 0)
                dealer.connect(weights_addr)
                asks = [Message(MANIFEST, {"version": 1, "newer": True}),
                        Message(BUCKET, {"version": 1, "base": -1, "index": 0})]  # fmt: skip
                while not stop.wait(0.05):
                    for ask in asks * 20:
                        try:
                            dealer.send_multipart(encode_message(ask))
                            flooded[0] += 1
                        except zmq.Again:
                            break
                dealer.close()

            attackers = [threading.Thread(target=f, daemon=True) for f in (impostor, flood)]
            for thread in attackers:
                thread.start()
            for i in range(2):
                more = [f"rollout.sampler_index={i}", f"rollout.sampler_id=sampler-{i}"]
                procs.append(start("sampler", config, [*overrides, *more], logs[f"s{i}"]))
            wait_for(lambda: RECEIVED.search(logs["s1"].read_text()), "sampler-1's first version",
                     procs)  # fmt: skip
            finish(procs, timeout=400)
            stop.set()
            for thread in attackers:
                thread.join(5)
    finally:
        stop.set()
        finish(procs, timeout=1)
        ctx.term()
    text = {r: p.read_text() for r, p in logs.items()}
    assert all(p.returncode == 0 for p in procs), text["s1"][-3000:]
    loaded = RECEIVED.findall(text["s1"])
    assert loaded and all(addr not in (fake, unresolvable) for _, addr, _ in loaded), loaded
    seen = {trick: text["s1"].count(says) for trick, says in REFUSALS.items()}
    played = dict(hostile.played)
    print(f"\nhostile relay: played {played}, sampler-1 refused {seen}; {flooded[0]} requests "
          "flooded the trainer")  # fmt: skip
    # How often sampler-1 asks the relay is the heartbeats' luck: every trick played was
    # refused, and the run met at least two of them.
    assert len(played) >= 2 and all(seen[trick] for trick in played), (played, seen)


def test_a_version_held_from_a_crashed_trainer_is_not_taken_for_the_resumed_one_s():
    """A sampler holding version 8 of a trainer that crashed: once the resumed trainer
    announces its own version 8 (other weights), the held one is not that version; the
    sampler's own starting weights always count as version 0."""
    from grpo.weights.stream.follower import VersionFollower

    crashed, resumed, seed = _forged(8), synthetic(8, QUICK), synthetic(0, QUICK)
    announced = {8: crashed.manifest.identity}
    follower = VersionFollower.__new__(VersionFollower)  # only what image() reads
    follower._cond, follower.failed, follower.announced = threading.Condition(), {}, None
    follower.broadcast = {}
    follower.seed, follower.trusted, follower.held = seed, lambda: announced, crashed
    assert follower.image(8) is crashed
    announced = {8: resumed.manifest.identity}  # the resumed trainer's heartbeat
    assert follower.image(8) is None
    follower.held = seed
    assert follower.image(0) is seed
