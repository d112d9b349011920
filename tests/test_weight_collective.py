"""weights.mode collective (issue 42, item 5): versions broadcast over a gloo group of their own
between the trainer's broadcaster and the samplers' members, real groups on loopback. A member
that stalls is dropped within weights.collective_timeout_s and the group re-forms without it;
it rejoins once it moves again. (Whole runs, a trainer and a sampler SIGKILLed and resumed,
ending with the straight run's weights bit for bit: tests/test_chaos.py.)"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bench.common import free_port
from grpo.config import Config, ConfigError, load_config
from grpo.config.weights import host_port
from grpo.weights.collective import group as wire
from grpo.weights.collective.broadcaster import Broadcaster
from grpo.weights.collective.member import GroupMember, LeftGroup
from grpo.weights.collective.membership import MAX_FAILED_INCARNATIONS, GroupInfo, invited
from grpo.weights.collective.rendezvous import (
    MAX_CONNECTIONS,
    MAX_VALUE_BYTES,
    RemoteStore,
    Rendezvous,
    keys_for,
)
from grpo.weights.stream.follower import VersionFollower
from grpo.weights.stream.image import Image
from grpo.weights.stream.server import VersionStore
from tests.xxh3_forgery import forged_image

TIMEOUT_S = 2.0


def collective_config() -> Config:
    cfg = Config()
    cfg.weights.mode = "collective"
    cfg.weights.collective_addr = f"tcp://127.0.0.1:{free_port()}"
    cfg.weights.collective_timeout_s = TIMEOUT_S
    return cfg


def version(v: int, bucket_bytes: int = 4096) -> Image:
    rng = np.random.default_rng(v)
    tensors = [(f"layer{i}.weight", "float32", (16, 32), rng.integers(-(2**31), 2**31, 512,
               dtype=np.int32)) for i in range(6)]  # fmt: skip
    return Image.build(v, tensors, bucket_bytes)


class Trainer:
    """The trainer's side of a collective run as the broadcaster sees it: the store, the
    samplers' states from their heartbeats, the group its heartbeats announce."""

    def __init__(self, cfg: Config, members: dict[str, GroupMember]):
        self.members = members
        self.store = VersionStore(keep=8, budget_bytes=1 << 30, delta=False, protected=8)
        self.broadcaster = Broadcaster(cfg, self.store, self.states)

    def states(self) -> dict[str, tuple[str, str]]:
        return {sid: ("incarnation", m.state) for sid, m in list(self.members.items())}

    @property
    def group(self) -> GroupInfo | None:  # what its heartbeats say
        return GroupInfo.from_json(self.broadcaster.announced)

    def publish(self, image: Image) -> None:
        self.store.add(image)
        self.broadcaster.publish(image.version)


class Sampler:
    def __init__(self, cfg: Config, sid: str, trainer: Trainer):
        self.got: dict[int, Image] = {}
        self.offered = threading.Event()
        self.member = GroupMember(
            cfg, sid, lambda: trainer.group and trainer.group.to_json(), self.offer
        )
        trainer.members[sid] = self.member

    def offer(self, image: Image) -> None:
        self.got[image.version] = image
        self.offered.set()


def wait_until(cond, what: str, timeout: float = 30.0) -> float:
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture
def run():
    made: list[tuple[Trainer, list[Sampler]]] = []

    def make(n: int) -> tuple[Trainer, list[Sampler]]:
        cfg = collective_config()
        trainer = Trainer(cfg, {})
        samplers = [Sampler(cfg, f"sampler-{i}", trainer) for i in range(n)]
        made.append((trainer, samplers))
        return trainer, samplers

    yield make
    for trainer, samplers in made:
        for s in samplers:
            s.member.close()
        trainer.broadcaster.close()


def same(a: Image, b: Image) -> bool:
    return a.manifest.identity == b.manifest.identity and all(
        np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays
    )


def test_every_version_reaches_every_member_bit_for_bit(run) -> None:
    trainer, samplers = run(2)
    wait_until(lambda: all(s.member.expects(1) for s in samplers), "the group")
    assert not any(s.member.expects(0) for s in samplers)  # sent before they joined
    sent = [version(v) for v in (1, 2, 3)]
    for image in sent:
        trainer.publish(image)
    wait_until(lambda: all(len(s.got) == 3 for s in samplers), "three versions each")
    for s in samplers:
        assert all(same(s.got[image.version], image) for image in sent)
    assert trainer.group is not None and trainer.group.members == ("sampler-0", "sampler-1")
    assert len(trainer.broadcaster.meeting.table) == 0  # sealed once formed: nothing to set
    # The broadcaster notes a version's time once its broadcast returned, which can be just
    # after the members took it (seen once in a full suite run).
    wait_until(lambda: set(trainer.broadcaster.seconds) == {1, 2, 3}, "the broadcast times")


def test_a_version_cut_like_the_one_before_is_sent_without_its_manifest(run, monkeypatch) -> None:
    """A generation's first version goes with its manifest; each after it, cut the same way,
    as a header carrying its buckets' checksums, then its buckets (two operations for a LoRA
    adapter, not three). Every version still reaches the member bit for bit."""
    sent: list[int] = []  # the sizes the broadcaster sent, headers and buckets left out
    header, broadcast = wire.HEADER_LEN * 8, wire.broadcast

    def spy(group, data: np.ndarray) -> None:
        if threading.current_thread().name == "broadcaster" and data.size != header:
            sent.append(data.size)
        broadcast(group, data)

    monkeypatch.setattr(wire, "broadcast", spy)
    trainer, samplers = run(1)
    wait_until(lambda: samplers[0].member.expects(1), "the group")
    images = [version(v) for v in (1, 2, 3)]
    for image in images:
        trainer.publish(image)
    wait_until(lambda: len(samplers[0].got) == 3, "three versions")
    assert all(same(samplers[0].got[image.version], image) for image in images)
    buckets = list(images[0].manifest.bucket_nbytes)
    manifest = sent[0]
    assert sent == [manifest, *buckets, *buckets, *buckets] and manifest not in buckets


def test_versions_of_more_buckets_than_a_header_holds_go_with_their_manifest(
    run, monkeypatch
) -> None:
    """A header carries at most MAX_INLINE_SUMS digests (a 6 GB model in 64 MiB buckets has
    94): a version of more buckets goes with its whole manifest every time, never as a header
    of some of its digests, and reaches the member bit for bit."""
    sent: list[int] = []
    header, broadcast = wire.HEADER_LEN * 8, wire.broadcast

    def spy(group, data: np.ndarray) -> None:
        if threading.current_thread().name == "broadcaster" and data.size != header:
            sent.append(data.size)
        broadcast(group, data)

    def many(v: int, n: int) -> Image:  # one 128-byte tensor a bucket
        rng = np.random.default_rng(v)
        bits = [rng.integers(-(2**31), 2**31, 32, dtype=np.int32) for _ in range(n)]
        tensors = [(f"layer{i}.weight", "float32", (4, 8), b) for i, b in enumerate(bits)]
        return Image.build(v, tensors, 128)

    monkeypatch.setattr(wire, "broadcast", spy)
    trainer, samplers = run(1)
    wait_until(lambda: samplers[0].member.expects(1), "the group")
    images = [many(v, wire.MAX_INLINE_SUMS + 5) for v in (1, 2, 3)]
    assert len(images[0].manifest.buckets) == wire.MAX_INLINE_SUMS + 5
    for image in images:
        trainer.publish(image)
    wait_until(lambda: len(samplers[0].got) == 3, "three versions", timeout=10)
    assert all(same(samplers[0].got[image.version], image) for image in images)
    buckets = list(images[0].manifest.bucket_nbytes)
    manifests = [sent[k * (len(buckets) + 1)] for k in range(3)]
    assert sent == [part for m in manifests for part in (m, *buckets)]
    assert not set(manifests) & set(buckets)


def test_a_header_cut_like_a_version_never_sent_ends_the_membership(run) -> None:
    """Before any version, and after one whose manifest holds another number of buckets than
    the header's digests."""
    trainer, samplers = run(1)
    member = samplers[0].member
    wait_until(lambda: member.expects(1), "the group")
    with pytest.raises(LeftGroup, match="version 7 said to be cut like a version not sent"):
        member._manifest(None, 7, 0, (1, 2))
    trainer.publish(version(1))
    wait_until(lambda: 1 in samplers[0].got, "version 1")
    assert len(member._previous.sums) == 3
    for sums in (("ab" * 32,) * 2, ("ab" * 32,) * 4):
        with pytest.raises(LeftGroup, match="version 2 said to be cut like a version not sent"):
            member._manifest(None, 2, 0, sums)


def test_a_stalled_member_is_dropped_in_time_and_rejoins_when_it_moves_again(run) -> None:
    """sampler-1 stops inside its thread for 3 bounds: the group is dropped within the bound
    plus a keepalive, the trainer re-forms it with sampler-0 alone (which gets the next version
    from it), and sampler-1 is back in a later group once it moves."""
    trainer, samplers = run(2)
    wait_until(lambda: all(s.member.expects(1) for s in samplers), "the group")
    release = threading.Event()
    stalled = samplers[1]

    def stall(image: Image) -> None:
        stalled.got[image.version] = image
        release.wait(3 * TIMEOUT_S)

    stalled.member.offer = stall
    trainer.publish(version(1))
    wait_until(lambda: 1 in stalled.got, "sampler-1 taking version 1")
    began = time.monotonic()
    waited = wait_until(
        lambda: trainer.group is not None and trainer.group.members == ("sampler-0",),
        "a group without sampler-1",
    )
    assert waited < TIMEOUT_S + trainer.broadcaster.keepalive_s + 3.0, waited
    # The failure is recorded by the member's incarnation and the generation it failed in:
    # what keeps the broadcaster from inviting it again before it says it left (invited).
    assert trainer.broadcaster.failed_in[("sampler-1", "incarnation")] == 1
    trainer.publish(version(2))
    wait_until(lambda: 2 in samplers[0].got, "version 2 in the new group")
    release.set()
    wait_until(
        lambda: trainer.group is not None and "sampler-1" in trainer.group.members,
        "sampler-1 back in a group",
    )
    trainer.publish(version(3))
    wait_until(lambda: 3 in stalled.got, "version 3 at the rejoined sampler-1")
    print(f"\ncollective: a stalled member dropped after {waited:.1f} s (bound {TIMEOUT_S} s), "
          f"rejoined {time.monotonic() - began:.1f} s after the stall began")  # fmt: skip


@pytest.mark.parametrize("tensor", ["layer0.weight", "layer3.weight", "layer5.weight"])
def test_a_version_failing_its_checksums_is_lost_but_the_group_goes_on(run, tensor) -> None:
    """Whichever of the version's three buckets (the first, a middle one, the last) holds the
    changed tensor."""
    trainer, samplers = run(1)
    member = samplers[0].member
    wait_until(lambda: member.expects(1), "the group")
    forged = version(1)
    forged.arrays[tensor] = forged.arrays[tensor] ^ 1  # not its manifest's
    trainer.publish(forged)
    trainer.publish(version(2))
    wait_until(lambda: 2 in samplers[0].got, "version 2")
    assert 1 not in samplers[0].got and not member.expects(1)  # the follower streams it
    assert member.expects(3) and member.state.startswith("member:")


def test_a_fault_of_the_broadcaster_s_own_is_named_and_the_group_comes_back(
    run, monkeypatch, caplog
) -> None:
    """Issue 63, item 9: an exception other than gloo's RuntimeError inside the broadcaster's
    thread (a slip of ours) used to end the thread quietly, every version after it by stream.
    Now it is logged with its name, the group is dropped and formed again, and the next
    version is broadcast."""
    trainer, samplers = run(1)
    member = samplers[0].member
    wait_until(lambda: member.expects(1), "the group")
    broadcast, raised = wire.broadcast, []

    def fails_once(group, data: np.ndarray) -> None:
        if threading.current_thread().name == "broadcaster" and not raised:
            raised.append(1)
            raise TypeError("a slip in the broadcaster")
        broadcast(group, data)

    monkeypatch.setattr(wire, "broadcast", fails_once)
    with caplog.at_level(logging.INFO, logger="grpo.trainer"):
        trainer.publish(version(1))
        wait_until(lambda: raised and trainer.broadcaster.generation >= 2, "a new generation")
        trainer.publish(version(2))
        wait_until(lambda: 2 in samplers[0].got, "version 2 by the new group")
    assert trainer.broadcaster._thread.is_alive()
    assert "collective broadcaster failed (TypeError: a slip in the broadcaster)" in caplog.text
    assert "dropped: the broadcaster's own TypeError" in caplog.text


def test_xxh3_equal_buckets_from_the_group_are_refused(run) -> None:
    """Issue 62, finding 1: a broadcast of version 1's manifest with its buckets' bytes forged to
    the same XXH3-64 (what a group impostor would send): the digests refuse it, nothing is
    offered, and the trainer's real version 2 still comes."""
    trainer, samplers = run(1)
    member = samplers[0].member
    wait_until(lambda: member.expects(1), "the group")
    trainer.publish(forged_image(version(1)))
    trainer.publish(version(2))
    wait_until(lambda: 2 in samplers[0].got, "version 2")
    assert 1 not in samplers[0].got and not member.expects(1)


def test_closing_while_a_group_forms_says_what_it_waits_for(caplog) -> None:
    """A sampler said it was ready and went away before joining: the trainer's close waits for
    the group's forming to fail, says so, and is done within the bound."""
    store = VersionStore(keep=2, budget_bytes=1 << 20, delta=False)
    broadcaster = Broadcaster(collective_config(), store, lambda: {"gone": ("i", "ready:0")})
    wait_until(lambda: broadcaster.announced is not None, "the group forming")
    with caplog.at_level(logging.INFO, logger="grpo.trainer"):
        began = time.monotonic()
        broadcaster.close()
        took = time.monotonic() - began
    assert "closing once the collective group's operation under way ends, within 2 s" in (
        caplog.text
    )
    assert took < TIMEOUT_S + 1.5 and not broadcaster._thread.is_alive(), took


def test_who_the_next_group_holds() -> None:
    ready, member = ("i", "ready:0"), ("i", "member:1")
    assert invited({"a": ready, "b": member}, (), {}) == ("a",)
    assert invited({"a": ready}, ("b",), {}) == ("a", "b")  # members stay, the ready join
    # Failed in generation 3: invited again only once it says it left generation 3 ...
    assert invited({"a": ("i", "ready:2")}, (), {("a", "i"): 3}) == ()
    assert invited({"a": ("i", "ready:3")}, (), {("a", "i"): 3}) == ("a",)
    # ... or when it is another process: a restarted sampler starts afresh.
    assert invited({"a": ("j", "ready:0")}, (), {("a", "i"): 3}) == ("a",)
    # ... but not once it failed under MAX_FAILED_INCARNATIONS of them: a peer flipping its
    # incarnation does not keep the group re-forming (its versions come by stream).
    failed = {("a", str(k)): k + 1 for k in range(MAX_FAILED_INCARNATIONS)}
    assert invited({"a": ("new", "ready:0"), "b": ready}, (), failed) == ("b",)
    assert invited({"a": ("0", "ready:1")}, (), failed) == ("a",)  # an incarnation it knew
    assert invited({"a": ("i", "ready:x"), "b": ("i", "")}, (), {}) == ()


def test_a_group_announcement_is_taken_only_when_well_formed() -> None:
    good = GroupInfo("e", 2, ("s0", "s1"), "ab" * 16)
    assert GroupInfo.from_json(good.to_json()) == good and good.rank("s1") == 2
    body = good.to_json()
    for bad in (None, 3, {**body, "generation": 0}, {**body, "members": []},
                {**body, "members": ["s0", "s0"]}, {**body, "epoch": 7},
                {**body, "key": ""}, {**body, "key": "AB" * 16}, {**body, "key": "ab" * 15},
                {k: v for k, v in body.items() if k != "key"}):  # fmt: skip
        assert GroupInfo.from_json(bad) is None, bad


def listeners(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net shows them) of every TCP socket listening on
    `port`, IPv4 and IPv6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_the_rendezvous_listens_on_the_configured_address_alone() -> None:
    """Issue 62, finding 3: TCPStore bound every interface ("::") whatever host it was given;
    the trainer's rendezvous listens on weights.collective_addr's host only."""
    port = free_port()
    meeting = Rendezvous(f"tcp://127.0.0.1:{port}", TIMEOUT_S)
    try:
        assert listeners(port) == {"0100007F"}  # 127.0.0.1, and nothing on IPv6
    finally:
        meeting.close()


def test_a_peer_without_the_generation_s_key_gets_no_seat() -> None:
    """Issue 62, finding 3: the trainer waits for sampler-0 in generation 1; an impostor that
    reaches the rendezvous and knows the generation and rank, but not the key the trainer
    announced over the control channel, meets nobody and can set nothing there (the seats'
    keys used to be guessable, and TCPStore took any key)."""
    cfg = collective_config()
    store = VersionStore(keep=2, budget_bytes=1 << 20, delta=False)
    broadcaster = Broadcaster(cfg, store, lambda: {"sampler-0": ("i", "ready:0")})
    try:
        wait_until(lambda: broadcaster.announced is not None, "the group forming")
        addr = cfg.weights.collective_addr
        impostor = RemoteStore(addr, TIMEOUT_S)
        with pytest.raises(RuntimeError, match="refused a key outside the generation"):
            wire.form(impostor, wire.prefix(1, "0" * 32), 1, 2, wire.local_interface(addr),
                      TIMEOUT_S)  # fmt: skip
        assert len(broadcaster.meeting.table) == 1  # the trainer's own seat, nothing else
    finally:
        broadcaster.close()


def test_the_rendezvous_caps_what_one_generation_holds() -> None:
    """Issue 62, item 2: keys only under the generation being formed, at most keys_for(size)
    of them, each value at most MAX_VALUE_BYTES, and none once the group formed; a request
    past the frame bounds closes its connection (24 values of 8 MiB grew a TCPStore's trainer
    by 219 MiB)."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    meeting = Rendezvous(addr, TIMEOUT_S)
    peer = RemoteStore(addr, TIMEOUT_S)
    try:
        meeting.table.open("generation-1-secret", size=2)
        peer.set("generation-1-secret/0/1", b"address")
        assert peer.get("generation-1-secret/0/1") == b"address"
        with pytest.raises(RuntimeError, match="outside the generation"):
            peer.set("generation-1-secre/x", b"")
        with pytest.raises(RuntimeError, match="rendezvous at"):  # cut off, not read
            peer.set("generation-1-secret/big", bytes(MAX_VALUE_BYTES + 1))
        assert not peer.check(["generation-1-secret/big"])  # on a new connection
        for k in range(keys_for(2) - 1):
            peer.set(f"generation-1-secret/{k}", b"x")
        with pytest.raises(RuntimeError, match=f"more than {keys_for(2)} keys"):
            peer.set("generation-1-secret/one-more", b"x")
        assert len(meeting.table) == keys_for(2)
        meeting.table.seal()
        assert len(meeting.table) == 0
        meeting.table.open("generation-1-secret", size=2)  # the next one, its own bound
        meeting.local.set("generation-1-secret/0/0", b"x")
        with pytest.raises(RuntimeError, match="a value of 65537 bytes"):
            meeting.local.set("generation-1-secret/0/0", bytes(MAX_VALUE_BYTES + 1))
        meeting.table.seal()
        with pytest.raises(RuntimeError, match="outside the generation"):
            peer.set("generation-1-secret/0/1", b"address")
        raw = socket.create_connection(host_port(addr), TIMEOUT_S)
        raw.sendall(b"S" + (1 << 16 - 1).to_bytes(2, "big") + (8 << 20).to_bytes(4, "big"))
        assert raw.recv(1) == b""  # closed unanswered, nothing read past the header
        raw.close()
        assert meeting.refused == 5
    finally:
        peer.close_connection()
        meeting.close()


def test_the_rendezvous_serves_a_bounded_number_of_connections() -> None:
    """Issue 62, item 2: connections beyond MAX_CONNECTIONS are closed at once, and a held
    one frees its place when it closes."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    meeting = Rendezvous(addr, TIMEOUT_S)
    held = [socket.create_connection(host_port(addr), TIMEOUT_S) for _ in range(MAX_CONNECTIONS)]
    try:
        extra = socket.create_connection(host_port(addr), TIMEOUT_S)
        assert extra.recv(1) == b""
        extra.close()
        held.pop().close()
        wait_until(lambda: meeting._connections._value == 1, "a place freed")
        meeting.table.open("generation-1-k", size=2)
        peer = RemoteStore(addr, TIMEOUT_S)
        peer.set("generation-1-k/0/1", b"a")
        peer.close_connection()
    finally:
        for conn in held:
            conn.close()
        meeting.close()


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["transport.weights_addr="], "needs transport.weights_addr"),
        (["weights.collective_addr=tcp://10.1.2.3:5558"], "beyond loopback"),
        (["weights.collective_addr=tcp://127.0.0.1:5555"], "another transport address"),
        (["weights.collective_addr=127.0.0.1:5558"], "tcp://host:port"),
        (["weights.collective_timeout_s=0"], "must be positive"),
    ],
)
def test_collective_settings_are_refused_with_their_reason(overrides, error) -> None:
    base = ["weights.mode=collective", "transport.weights_addr=tcp://127.0.0.1:5557"]
    with pytest.raises(ConfigError, match=error):
        load_config(None, [*base, *overrides])
    load_config(None, [*base, "weights.collective_addr=tcp://10.1.2.3:5558",
                       "transport.allow_insecure=true"])  # fmt: skip


def _follower(announced: dict[int, str]) -> VersionFollower:
    """A follower as weights.mode collective wires it, without its thread or sockets: only
    what offer(), image() and _next() read."""
    follower = VersionFollower.__new__(VersionFollower)
    follower._cond, follower._closing = threading.Condition(), threading.Event()
    follower.failed, follower.announced, follower.node = {}, None, None
    follower.seed, follower.held, follower.broadcast = None, None, {}
    follower.trusted, follower._target = (lambda: announced), -1
    follower.expected, follower.changed = (lambda v: False), (lambda: None)
    return follower


def test_a_broadcast_version_is_taken_only_under_the_identity_the_trainer_announced() -> None:
    """The group's bytes are never taken on the group's word: a version is used once the
    trainer's control messages name its manifest's identity, and not when they name
    another's (a forged broadcast, or a crashed trainer's version of that number)."""
    announced: dict[int, str] = {}
    follower, sent = _follower(announced), version(4)
    follower.offer(sent)
    assert follower.image(4) is None  # not announced yet
    announced[4] = version(5).manifest.identity  # another manifest under that number
    assert follower.image(4) is None
    announced[4] = sent.manifest.identity
    assert follower.image(4) is sent


def test_an_unannounced_broadcast_does_not_replace_the_version_held() -> None:
    """Issue 62 (read in the code): the version held is the base of the sampler's next delta
    and what its relay serves; a broadcast replaces it only under an announced identity."""
    announced: dict[int, str] = {3: version(3).manifest.identity}
    follower = _follower(announced)
    follower.offer(held := version(3))
    follower.offer(version(4))  # the trainer announced no version 4
    assert follower.held is held
    announced[4] = version(5).manifest.identity  # nor this one as version 4
    follower.offer(version(4))
    assert follower.held is held
    announced[4] = version(4).manifest.identity
    follower.offer(real := version(4))
    assert follower.held is real
    follower.offer(later := version(6))  # came before its announcement ...
    assert follower.held is real
    announced[6] = later.manifest.identity
    assert follower.image(6) is later and follower.held is later  # ... held once announced


def test_a_version_the_group_will_bring_is_not_also_streamed() -> None:
    """The follower streams the version it wants only when the group will not bring it (the
    member's `expects`): a member of the group waits for the broadcast."""
    follower = _follower({})
    follower.expected = lambda v: v >= 3  # a member since version 3
    follower.want(4)
    asked: list[int | None] = []
    thread = threading.Thread(target=lambda: asked.append(follower._next()), daemon=True)
    thread.start()
    thread.join(0.5)
    assert not asked  # waiting for the group, not streaming
    follower.expected = lambda v: False  # it left the group
    thread.join(5)
    assert asked == [4]


def test_a_broadcast_the_trainer_never_announced_is_streamed_instead() -> None:
    """Once the group sent a version, the follower waits for it no more: when it is not the
    version the trainer announced (a forged broadcast), the follower streams it at once."""
    announced: dict[int, str] = {4: version(4).manifest.identity}
    follower = _follower(announced)
    follower.offer(version(5))  # not what the trainer announced ...
    follower.broadcast[4] = follower.broadcast.pop(5)  # ... under number 4
    follower.expected = lambda v: v > 4  # the member: version 4 was sent
    follower.want(4)
    asked: list[int | None] = []
    thread = threading.Thread(target=lambda: asked.append(follower._next()), daemon=True)
    thread.start()
    thread.join(5)
    assert asked == [4]
