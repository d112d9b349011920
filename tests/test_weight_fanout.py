"""Weight fan-out over real loopback sockets, one process per receiver (bench/weight_fanout.py
at small sizes): the trainer sends a version about once to a tree of relaying receivers, and a
relay SIGKILLed mid-version is routed around, its restarted process catching up from its parent."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import zmq

from bench.weight_fanout import MAX_BYTES, QUICK, chaos, fan_out, network, synthetic
from grpo.weights.stream import server
from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.image import Staging
from grpo.weights.stream.node import RelayNode
from grpo.weights.stream.relay import RelaySource
from grpo.weights.stream.server import VersionStore
from tests.conftest import REPO, free_port
from tests.test_weight_streaming import serving


def test_a_receivers_process_does_not_import_torch() -> None:
    """Dozens of them share a node's cores with its sampler: each must stay light."""
    check = "import sys, bench.weight_fanout; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], cwd=REPO).returncode == 0


def test_four_receivers_cost_the_trainer_one_copy() -> None:
    with network(QUICK, 4) as (trainer, rx):
        delivered = [fan_out(trainer, rx, 4, version, QUICK) for version in (1, 2)]
    for d in delivered:  # each receiver held the version, checked (fan_out raises otherwise)
        assert d.copies <= 1.2, d


def test_a_relay_killed_mid_version_is_routed_around_and_catches_up_from_its_parent() -> None:
    with network(QUICK, 4) as (trainer, rx):
        c = chaos(trainer, rx, 4, 1, QUICK)  # s001 killed; its child s003 goes to s000
    assert c.children == 1 and 0 < c.killed_after < QUICK.payload // QUICK.bucket_bytes, c
    assert c.fell_back.get("s003", 0) >= 1, c  # the victim's child did lose its parent
    assert c.copies <= 1.2 and c.catch_up_copies < 0.05 and c.parent_copies >= 0.99, c


def test_a_request_parked_past_its_time_is_refused_so_the_receiver_moves_on(monkeypatch) -> None:
    """A relay holds a request for a bucket it has not got for PARK_S, then refuses it: the
    receiver must take that refusal as one (and go to its next source at once), not as a
    stale answer to ignore while it waits out its own timeout."""
    monkeypatch.setattr(server, "PARK_S", 0.3)
    image = synthetic(1, QUICK)
    stuck = RelaySource()  # has the manifest, will never get a bucket
    stuck.started(Staging(image.manifest))
    store = VersionStore(keep=1, budget_bytes=1 << 30)
    store.add(image)
    ctx = zmq.Context()
    try:
        with serving(stuck, ctx) as relay, serving(store, ctx) as trainer:
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5)
            t0 = time.monotonic()
            got = rx.receive([relay, trainer], 1, None)
            elapsed = time.monotonic() - t0
    finally:
        ctx.term()
    assert got.manifest == image.manifest and rx.stats.fallbacks["source failed"] == 1
    assert elapsed < 2.5, elapsed  # not the 5 s timeout


def test_a_relay_refuses_at_once_a_version_older_than_its_own() -> None:
    """A relay that has moved on to version 2 will never get version 1: a child still asking
    for it must be sent on to its next source now, not held PARK_S for nothing."""
    store = VersionStore(keep=2, budget_bytes=1 << 30)
    ctx = zmq.Context()
    relay = RelayNode.on_loopback(ctx, MAX_BYTES, timeout_s=5).start()
    try:
        with serving(store, ctx) as trainer:
            for version in (1, 2):
                store.add(synthetic(version, QUICK))
                relay.receive(version, [trainer])
            rx = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5)
            t0 = time.monotonic()
            got = rx.receive([relay.addr, trainer], 1, None)
            elapsed = time.monotonic() - t0
    finally:
        relay.close()
        ctx.term()
    assert got.manifest == synthetic(1, QUICK).manifest
    assert rx.stats.fallbacks["source failed"] == 1 and elapsed < server.PARK_S / 2, elapsed


def test_a_child_that_hears_of_a_version_before_its_parent_still_gets_it_from_the_parent() -> None:
    """Announcements reach samplers at slightly different times: a child's request for a
    version its parent has not heard of yet waits for the parent, it does not fall back to
    the trainer (which would then send the version twice)."""
    store = VersionStore(keep=2, budget_bytes=1 << 30)
    ctx = zmq.Context()
    parent = RelayNode.on_loopback(ctx, MAX_BYTES, timeout_s=5).start()
    got: list = []
    try:
        with serving(store, ctx) as trainer:
            store.add(synthetic(1, QUICK))
            child = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5)
            asking = threading.Thread(
                target=lambda: got.append(child.receive([parent.addr, trainer], 1, None))
            )
            asking.start()
            time.sleep(0.5)  # the child has asked; the parent hears of version 1 only now
            parent.receive(1, [trainer])
            asking.join(10)
    finally:
        parent.close()
        ctx.term()
    assert got and got[0].manifest == synthetic(1, QUICK).manifest
    assert not child.stats.fallbacks, child.stats.fallbacks
    assert parent.server.egress.bytes[1] >= QUICK.payload  # the child's copy came from it


def test_children_wait_for_a_slow_relay_while_its_buckets_keep_coming(monkeypatch) -> None:
    """A parked request expires after PARK_S with no bucket coming into the relay, not after
    PARK_S in all: behind a slow link, whose whole version takes several PARK_S, the children
    still get every bucket from their parent."""
    monkeypatch.setattr(server, "PARK_S", 0.3)
    image = synthetic(1, QUICK)
    store = VersionStore(keep=1, budget_bytes=1 << 30)
    store.add(image)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    trainer = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    closing, failures = threading.Event(), []
    slow = server.TokenBucket(QUICK.payload / 1.5)  # 1.5 s a version: 5 PARK_S
    loop = server.StreamServer(router, store, closing, failures.append, limiter=slow)
    serving_thread = threading.Thread(target=loop.run, daemon=True)
    serving_thread.start()
    parent = RelayNode.on_loopback(ctx, MAX_BYTES, timeout_s=5).start()
    child, got = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=5), []
    try:
        asking = threading.Thread(
            target=lambda: got.append(child.receive([parent.addr, trainer], 1, None))
        )
        asking.start()
        parent.receive(1, [trainer])
        asking.join(10)
    finally:
        parent.close()
        closing.set()
        serving_thread.join(5)
        ctx.term()
    assert not failures and got and got[0].manifest == image.manifest
    assert not child.stats.fallbacks, child.stats.fallbacks
    assert loop.egress.bytes[1] < 1.2 * QUICK.payload  # the trainer sent it once


def test_relays_speak_curve_with_their_own_keys_and_refuse_strangers(tmp_path) -> None:
    """transport.curve_dir with relays: the trainer serves with its pair, each relay with its
    own sampler's; a child insists on its parent's key, a relay accepts only authorized/ keys
    (as the trainer does)."""
    from grpo.config import load_config
    from grpo.weights.stream.follower import VersionFollower
    from grpo.wire.keys import ClientKeys, generate, relay_key, secure_server

    generate(tmp_path, 2)
    trainer_addr = f"tcp://127.0.0.1:{free_port()}"
    cfg = load_config(None, [f"transport.curve_dir={tmp_path}", "weights.mode=stream",
                             f"transport.weights_addr={trainer_addr}", "weights.fanout=1",
                             "rollout.num_samplers=2", "weights.transfer_timeout_s=2"])  # fmt: skip
    image = synthetic(1, QUICK)
    store = VersionStore(keep=1, budget_bytes=1 << 30)
    store.add(image)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    auth = secure_server(ctx, [router], tmp_path)
    router.bind(trainer_addr)
    closing, failures = threading.Event(), []
    loop = threading.Thread(
        target=server.StreamServer(router, store, closing, failures.append).run, daemon=True
    )
    loop.start()
    relays: dict[str, str] = {}
    out = [-1]  # the newest version announced: none until the tree is known
    contexts = [zmq.Context(), zmq.Context()]  # a process each: one ZAP handler a context
    followers = [
        VersionFollower(cfg, c, sid, ClientKeys.load(tmp_path, sid), lambda: relays, lambda: out[0])
        for c, sid in zip(contexts, ("sampler-0", "sampler-1"), strict=True)
    ]
    try:
        relays.update({f.sampler_id: f.address for f in followers})
        out[0] = 1
        deadline = time.monotonic() + 20
        while any(f.image(1) is None for f in followers) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = followers[1].receiver
        # a stranger with the relay's right key but a key of its own nobody authorised
        stranger = VersionFetcher(ctx, None, MAX_BYTES, timeout_s=1)
        public, secret = zmq.curve_keypair()
        own = ClientKeys(public, secret, relay_key(tmp_path, "sampler-0"))
        stranger.secure = lambda sock, addr: own.apply(sock)
        with pytest.raises(ValueError, match="nothing for 1 s"):
            stranger.receive([followers[0].address], 1, None)
    finally:
        for f in followers:
            f.close()
        for c in contexts:
            c.term()
        closing.set()
        loop.join(5)
        auth.stop()
        ctx.term()
    assert all(f.image(1) is not None and f.image(1).manifest == image.manifest for f in followers)
    assert child.source == followers[0].address and not child.stats.fallbacks  # via the relay
    assert not failures
