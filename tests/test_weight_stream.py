"""Weights over ZeroMQ: chunked, checksummed, versioned copies into the sampler's own run dir."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from grpo.config import Config
from grpo.models.shared_policy import SharedPolicy
from grpo.weights import files as weight_stream
from grpo.weights.dirs import publish_version, verify_version, version_dir
from grpo.weights.files import CHUNK_BYTES, MAX_REQUEST_BYTES, WeightFetcher, _reply, serve
from grpo.weights.in_use import WeightsInUse
from grpo.weights.modes.base import Receiver, Unavailable
from grpo.weights.serving import WeightsServer
from grpo.weights.version import Version
from grpo.wire import messages
from grpo.wire.channels import PeerError
from grpo.wire.codec import Message
from grpo.wire.trainer_channel import TrainerChannel
from tests.conftest import free_port, transport_overrides
from tests.test_transport import _cfg


def _publish(run_dir: Path, version: int, size: int) -> Path:
    payload = bytes((version * 7 + i) % 251 for i in range(251)) * (size // 251 + 1)

    def save(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(payload[:size])
        (tmp / "config.json").write_text(json.dumps({"v": version}))

    return publish_version(run_dir, version, save, keep=3, step=version)


@pytest.fixture
def channels(tmp_path: Path):
    """The trainer's weights server over tmp_path/trainer (weights.mode files) and a sampler's
    fetcher; what the server reported failing, if anything."""
    cfg = _cfg(
        peer_timeout_s=10, startup_timeout_s=10, weights_addr=f"tcp://127.0.0.1:{free_port()}"
    )
    failures: list[str] = []
    server = WeightsServer(
        cfg, lambda router, closing, failed: serve(router, tmp_path / "trainer", closing, failed),
        MAX_REQUEST_BYTES, failures.append,
    )  # fmt: skip
    ctx = zmq.Context()
    fetcher = WeightFetcher(ctx, cfg.weights_addr, cfg.peer_timeout_s)
    yield failures, fetcher, tmp_path
    fetcher.close()
    ctx.term()
    server.close()


def test_a_version_arrives_in_chunks_and_checks_out(channels, monkeypatch):
    failures, fetcher, tmp = channels
    # Every request the trainer's weights server answers, as (kind, file, offset). The server
    # thread looks _reply up at each request, and a fetch returns only after the answer to its
    # last request, so the list is complete when fetch returns.
    served: list[tuple[str, str | None, int | None]] = []

    def counted_reply(run_dir: Path, request: Message) -> Message:
        served.append((request.kind, request.body.get("file"), request.body.get("offset")))
        return _reply(run_dir, request)

    monkeypatch.setattr(weight_stream, "_reply", counted_reply)
    size = 2 * CHUNK_BYTES + 12345  # three chunks
    source = _publish(tmp / "trainer", 3, size)
    local = fetcher.fetch(tmp / "sampler", 3, keep=2)
    assert local == version_dir(tmp / "sampler", 3)
    verify_version(local)
    for name in ("model.safetensors", "config.json"):
        assert (local / name).read_bytes() == (source / name).read_bytes()
    # The manifest, then each file (in the manifest's sorted order) chunk by chunk.
    assert served == [
        (messages.MANIFEST, None, None),
        (messages.CHUNK, "config.json", 0),
        *((messages.CHUNK, "model.safetensors", k * CHUNK_BYTES) for k in range(3)),
    ]
    served.clear()
    assert fetcher.fetch(tmp / "sampler", 3, keep=2) == local
    # Intact and the server's own (the manifests are equal): no transfer, the manifest only.
    assert served == [(messages.MANIFEST, None, None)]
    for v in (4, 5):
        _publish(tmp / "trainer", v, 1000)
        fetcher.fetch(tmp / "sampler", v, keep=2)
    assert sorted(p.name for p in (tmp / "sampler/versions").iterdir()) == ["v000004", "v000005"]


def test_missing_or_corrupt_versions_are_not_installed(channels):
    failures, fetcher, tmp = channels
    with pytest.raises(ValueError, match="could not fetch version 9: the trainer cannot serve it"):
        fetcher.fetch(tmp / "sampler", 9, keep=2)
    source = _publish(tmp / "trainer", 1, 5000)
    data = bytearray((source / "model.safetensors").read_bytes())
    data[10] ^= 1  # rots on the trainer's disk after its manifest was written
    (source / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        fetcher.fetch(tmp / "sampler", 1, keep=2)
    assert not version_dir(tmp / "sampler", 1).exists()
    # The fetcher still works afterwards.
    _publish(tmp / "trainer", 2, 5000)
    verify_version(fetcher.fetch(tmp / "sampler", 2, keep=2))


def test_requests_cannot_name_files_outside_the_version(tmp_path):
    _publish(tmp_path, 1, 100)
    (tmp_path / "secret.txt").write_text("no")
    for name in ("../../secret.txt", "/etc/passwd", "version.json"):
        reply = _reply(tmp_path, Message("chunk", {"version": 1, "file": name, "offset": 0}))
        assert reply.kind == "missing" and reply.body["reason"] == "bad request"
    assert _reply(tmp_path, Message("manifest", {"version": "1"})).kind == "missing"


def test_silent_weights_server_times_out_clearly(tmp_path):
    cfg = _cfg(
        peer_timeout_s=1, startup_timeout_s=10, weights_addr=f"tcp://127.0.0.1:{free_port()}"
    )
    ctx = zmq.Context()
    fetcher = WeightFetcher(ctx, cfg.weights_addr, cfg.peer_timeout_s)  # no trainer at all
    try:
        with pytest.raises(ValueError, match="no answer from the trainer's weights server"):
            fetcher.fetch(tmp_path, 1, keep=2)
    finally:
        fetcher.close()
        ctx.term()


@pytest.mark.slow
@pytest.mark.extended  # CI leaves it out; serving and fetching: test_weight_streaming.py
def test_sampler_without_the_trainers_filesystem(tmp_path, tiny_model_dir):
    """The sampler writes to its own output_dir and gets every version over the socket, each
    published in shards (train.max_shard_size: the tiny model's embedding alone is 12.6 MB)."""
    from tests.test_chaos import finish, start
    from tests.test_integration import tiny_config

    config = tiny_config(tmp_path, tiny_model_dir, train={"num_ranks": 1, "max_shard_size": "4MB"})
    overrides = [*transport_overrides(), f"transport.weights_addr=tcp://127.0.0.1:{free_port()}"]
    trainer = start("trainer", config, overrides, tmp_path / "trainer.log")
    sampler_out = [*overrides, f"output_dir={tmp_path / 'sampler_node'}"]
    sampler = start("sampler", config, sampler_out, tmp_path / "sampler.log")
    finish([trainer, sampler], timeout=400)
    log = (tmp_path / "sampler.log").read_text()
    assert trainer.returncode == 0 and sampler.returncode == 0, log[-3000:]
    assert len([line for line in log.splitlines() if "fetched version" in line]) >= 2
    assert "reloaded weights: version 1 -> 2" in log
    here, there = tmp_path / "sampler_node/tiny/versions", tmp_path / "runs/tiny/versions"
    # The last version it sampled with (v3, the final one, nobody samples with).
    shards = sorted(p.name for p in (there / "v000002").glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and not (there / "v000002/model.safetensors").exists()
    for name in [*shards, "model.safetensors.index.json"]:
        assert (here / "v000002" / name).read_bytes() == (there / "v000002" / name).read_bytes()


def _ask(addr: str, body: object, kind: str = messages.CHUNK) -> Message:
    """One raw request to the weights server, as any peer could send it; its answer."""
    import zmq

    from grpo.wire.codec import MAGIC, SCHEMA_VERSION, decode, seal

    header = {"magic": MAGIC, "schema": SCHEMA_VERSION, "kind": "message", "msg_kind": kind,
              "body": body}  # fmt: skip
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        sock.send_multipart(seal(msgpack.packb(header, use_bin_type=True)))
        assert sock.poll(timeout=10_000), f"no answer to {body!r}: the weights server is gone"
        reply = decode(sock.recv_multipart())
        assert isinstance(reply, Message)
        return reply
    finally:
        sock.close()
        ctx.term()


def test_malformed_weight_requests_are_answered_and_the_server_lives_on(channels):
    """finding 3: a chunk request whose `file` is a list raised TypeError outside the
    per-request handling: the serving thread ended, and every sampler kept its old weights
    for the rest of the run. Each malformed request is now answered, and the server goes on."""
    failures, fetcher, tmp = channels
    _publish(tmp / "trainer", 1, 5000)
    addr = fetcher.addr
    for body in (
        {"version": 1, "file": ["model.safetensors"], "offset": 0},
        {"version": 1, "file": {"a": 1}, "offset": 0},
        {"version": 1, "file": "model.safetensors", "offset": -5},
        {"version": 1, "file": "model.safetensors", "offset": "0"},
        {"version": 1, "file": "model.safetensors", "offset": 1 << 63},
        {"version": 7, "file": "model.safetensors", "offset": 0},
        {"version": [1], "file": "model.safetensors", "offset": 0},
        {"version": True},
        {},
    ):
        assert _ask(addr, body).kind == messages.MISSING, body
    assert _ask(addr, {"version": 1}, kind="nonsense").kind == messages.MISSING
    # The trainer's own version.json rotted into something that is not a manifest.
    (version_dir(tmp / "trainer", 1) / "version.json").write_text("[1, 2]")
    assert _ask(addr, {"version": 1, "file": "x", "offset": 0}).kind == messages.MISSING
    _publish(tmp / "trainer", 2, 5000)
    verify_version(fetcher.fetch(tmp / "sampler", 2, keep=2))
    assert failures == []


def test_a_weights_server_that_dies_stops_the_run_with_its_cause(tmp_path, monkeypatch):
    """finding 3: a serving thread that ended anyway did so silently (samplers kept their
    weights); the trainer's channel now raises its cause at the next receive, though the
    weights server is not the channel's (weights.mode files' trainer end, as a run wires it)."""
    from grpo.config import Config
    from grpo.weights.modes import files as files_mode
    from grpo.wire.channels import PeerError

    def broken(router, run_dir, closing, failed):
        router.close()
        failed("the weights server failed: OSError: disk gone")

    monkeypatch.setattr(files_mode, "serve_dirs", broken)
    cfg = Config(output_dir=str(tmp_path))
    cfg.transport = _cfg(weights_addr=f"tcp://127.0.0.1:{free_port()}")
    trainer = TrainerChannel(cfg.transport)
    end = files_mode.DirServer(cfg, None)
    try:
        end.start(SimpleNamespace(published=0, members=dict, failed=trainer.fail))
        assert end.server is not None
        end.server._thread.join(timeout=10)
        with pytest.raises(PeerError, match="the weights server failed: OSError: disk gone"):
            trainer.receive(timeout_ms=0)
    finally:
        end.close()
        trainer.close()


def test_a_failing_heartbeat_thread_stops_the_run_with_its_cause(tmp_path):
    """finding 3: the control socket's thread logged its failure and ended: samplers then
    timed out with no word of why. Its cause now ends the run at the next receive."""
    from grpo.wire.channels import PeerError

    def status() -> dict:
        raise RuntimeError("status broke")

    trainer = TrainerChannel(_cfg(), status=status)
    try:
        trainer._thread.join(timeout=10)
        with pytest.raises(PeerError, match="heartbeat thread failed: RuntimeError: status broke"):
            trainer.receive(timeout_ms=0)
    finally:
        trainer.close()


def test_a_local_copy_from_another_run_is_not_taken_for_the_servers(channels):
    """finding 8: a sampler node holding an intact v1 of an earlier run of the same name
    loaded it without asking the server; a local version now counts only if its manifest is
    the server's."""
    failures, fetcher, tmp = channels
    _publish(tmp / "trainer", 1, 3000)
    stale = version_dir(tmp / "sampler", 1)
    _publish(tmp / "earlier", 1, 4000)
    stale.parent.mkdir(parents=True)
    version_dir(tmp / "earlier", 1).rename(stale)
    verify_version(stale)  # intact, but another run's
    local = fetcher.fetch(tmp / "sampler", 1, keep=2)
    source = version_dir(tmp / "trainer", 1)
    for name in ("model.safetensors", "config.json", "version.json"):
        assert (local / name).read_bytes() == (source / name).read_bytes()


def test_failed_fetches_leave_no_temporary_dirs(channels, monkeypatch):
    """finding 8: a failed fetch left its .vNNNNNN.fetch dir behind for good (pruning looks at
    v* only); the fetch removes them after a failure, and those of earlier processes at start."""
    failures, fetcher, tmp = channels
    versions = tmp / "sampler" / "versions"
    leftover = versions / ".v000004.fetch"  # from a sampler killed mid-fetch
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    source = _publish(tmp / "trainer", 1, 5000)
    (source / "model.safetensors").write_bytes(b"rotted")
    with pytest.raises(ValueError):
        fetcher.fetch(tmp / "sampler", 1, keep=2)
    assert [p.name for p in versions.iterdir()] == []


def test_replies_must_answer_the_request(channels, monkeypatch):
    """finding 8: a chunk reply's version, file and offset were not checked: a confused or
    hostile server could have a chunk of another file written at this offset."""
    failures, fetcher, tmp = channels
    _publish(tmp / "trainer", 1, 5000)
    for field, wrong in (("offset", 17), ("file", "config.json"), ("version", 0)):

        def skewed(run_dir: Path, request: Message, field=field, wrong=wrong) -> Message:
            reply = _reply(run_dir, request)
            if reply.kind == messages.CHUNK and request.body.get("file") == "model.safetensors":
                return Message(reply.kind, {**reply.body, field: wrong})
            return reply

        monkeypatch.setattr(weight_stream, "_reply", skewed)
        with pytest.raises(ValueError, match=f"{field} {wrong!r} where .* was asked for"):
            fetcher.fetch(tmp / "sampler", 1, keep=2)
        assert not version_dir(tmp / "sampler", 1).exists()


def test_a_manifest_beyond_the_size_bound_is_refused_before_writing(channels, monkeypatch):
    """finding 8: the manifest's sizes were unbounded, so a bad server could fill the
    sampler's disk before any checksum was checked. A file, or the total, beyond
    transport.max_version_bytes is refused before anything is written."""
    failures, fetcher, tmp = channels
    _publish(tmp / "trainer", 1, 5000)
    for sizes in ({"model.safetensors": 1 << 45}, {f"m{i}": 1 << 39 for i in range(4)}):

        def huge(run_dir: Path, request: Message, sizes=sizes) -> Message:
            reply = _reply(run_dir, request)
            if reply.kind != messages.MANIFEST:
                return reply
            files = {n: {**f, "bytes": b} for (n, f), b in zip(
                ((n, reply.body["manifest"]["files"]["config.json"]) for n in sizes),
                sizes.values(), strict=True)}  # fmt: skip
            return Message(reply.kind, {**reply.body, "manifest": {"files": files}})

        monkeypatch.setattr(weight_stream, "_reply", huge)
        with pytest.raises(ValueError, match="transport.max_version_bytes"):
            fetcher.fetch(tmp / "sampler", 1, keep=2)
        assert not (tmp / "sampler" / "versions").exists() or not any(
            (tmp / "sampler" / "versions").iterdir()
        )


def test_pruning_keeps_the_newest_versions_by_number(tmp_path):
    """finding 8: prune_versions sorted names as text, so past v999999 it removed the newest."""
    from grpo.weights.dirs import prune_versions

    for v in (999_998, 999_999, 1_000_000):
        version_dir(tmp_path, v).mkdir(parents=True)
    (tmp_path / "versions" / ".v000005.tmp").mkdir()  # not a version: left to its writer
    prune_versions(tmp_path, keep=2)
    names = sorted(p.name for p in (tmp_path / "versions").iterdir())
    assert names == [".v000005.tmp", "v1000000", "v999999"]


class _ScriptedReceiver(Receiver):
    """A mode's receiver whose fetches a test scripts: `fetch(number)` says why the fetch of
    version `number` fails (raised as Unavailable), or None: the version comes whole. It keeps
    the versions asked for and the failures it was told to forget."""

    def __init__(self, fetch: Callable[[int], str | None]):
        self.fetch, self.asked, self.forgotten = fetch, [], []

    def get(self, number: int) -> Version:
        self.asked.append(number)
        if why := self.fetch(number):
            raise Unavailable(why)
        return Version(number, False, state={})

    def forget_failure(self, number: int) -> None:
        self.forgotten.append(number)


def _on_a_stand_in_trainer(
    tmp_path: Path, fetch: Callable[[int], str | None], samplers: int = 1
) -> tuple[WeightsInUse, SimpleNamespace, _ScriptedReceiver]:
    """A sampler's WeightsInUse (no model loaded) following a stand-in trainer whose status, at
    version 3 and no restart, the test moves; its endpoint's wait returns at once unless the
    test replaces it; versions fetched through a _ScriptedReceiver, failures recorded by the
    real WeightsInUse.reload."""
    cfg = Config(output_dir=str(tmp_path))
    cfg.rollout.num_samplers = samplers
    weights = WeightsInUse(cfg, SharedPolicy(cfg, tmp_path / "model"))
    status = SimpleNamespace(version=3, restarts=0)
    weights.trainer = SimpleNamespace(  # type: ignore[assignment]
        status=status, stopped=threading.Event(), wait_until=lambda ready, what: None
    )
    weights.receiver = receiver = _ScriptedReceiver(fetch)
    return weights, status, receiver


def test_a_sampler_that_cannot_get_the_version_it_needs_stops_naming_it(tmp_path):
    """finding 3: a sampler whose fetch of the version the next batch needs failed logged
    "keeping version 0" and sampled on with the old weights, beyond train.max_staleness. It now
    stops, naming the version and the cause."""
    weights, status, _ = _on_a_stand_in_trainer(
        tmp_path, lambda n: f"could not fetch version {n}: the weights server is gone"
    )
    status.version = 2
    why = r"needs version 2 or newer.* version 2 could not be loaded: could not fetch version 2"
    with pytest.raises(PeerError, match=why + ": the weights server is gone"):
        weights.serve(lambda: 2)
    assert weights.version == 0


def test_a_version_lost_to_a_trainer_restart_is_waited_for_again(tmp_path):
    """The trainer announced version 3 and died; restarted from its state of step 2, it has no
    version 3 when the sampler asks. The sampler waits for the restarted trainer to publish it
    again rather than stopping (a chaos run once ended so: "it has no version 3")."""

    def fetch(version: int) -> str | None:
        if receiver.asked == [3]:  # meanwhile the trainer restarted at version 2
            status.version = 2
            return "tcp://trainer: it has no version 3"
        return None

    def wait_until(ready, what: str) -> None:
        if not ready():
            status.version = 3  # the restarted trainer publishes it again

    weights, status, receiver = _on_a_stand_in_trainer(tmp_path, fetch)
    weights.trainer.wait_until = wait_until  # type: ignore[union-attr]
    weights.serve(lambda: 3)
    assert receiver.asked == [3, 3] and weights.version == 3 and not weights.failed_reloads
    assert receiver.forgotten == [3]  # the stream follower keeps a failure until told otherwise


def test_a_failure_just_before_the_trainer_s_restart_shows_is_not_yet_a_stall(tmp_path):
    """The fetch of version 3 failed against the restarted trainer ("it has no version 3")
    before its first heartbeat said it restarted: the sampler stopped at once, naming version
    3 (a chaos run in CI). It now listens to the trainer's next heartbeats first: they say
    it restarted, and the sampler waits for version 3 again and loads it."""
    waits: list[str] = []

    def wait_until(ready, what: str) -> None:
        waits.append(what)
        if not ready():  # the heartbeat after the failure: the trainer restarted
            status.restarts, status.version = 1, 3

    weights, status, receiver = _on_a_stand_in_trainer(  # the trainer's restart not heard yet
        tmp_path,
        lambda n: "tcp://trainer: it has no version 3" if n == 3 and status.restarts == 0 else None,
    )
    weights.trainer.wait_until = wait_until  # type: ignore[union-attr]
    weights.serve(lambda: 3)
    assert receiver.asked == [3, 3] and weights.version == 3 and not weights.failed_reloads
    assert receiver.forgotten == [3] and any("after version 3 failed" in w for w in waits)


def test_a_sampler_within_the_bound_tries_a_failed_version_again_after_a_restart(tmp_path):
    """One of two samplers holds version 2, within the bound, and its fetch of the newest, 3,
    failed: it samples on with version 2 and does not ask again. Once the trainer restarted
    it asks again (the failure was the old incarnation's) without waiting for anything."""
    weights, status, receiver = _on_a_stand_in_trainer(
        tmp_path,
        lambda n: "tcp://trainer: the bytes fail the manifest" if status.restarts == 0 else None,
        samplers=2,
    )
    weights.version = 2
    weights.serve(lambda: 2)
    weights.serve(lambda: 2)
    assert receiver.asked == [3] and weights.version == 2  # failed once, not asked again
    status.restarts = 1
    weights.serve(lambda: 2)
    assert receiver.asked == [3, 3] and weights.version == 3 and not weights.failed_reloads


def test_a_version_that_failed_before_a_trainer_restart_is_tried_again_after_it(tmp_path):
    """Issue 62 (low): a failure recorded while the trainer restarted stuck when the new
    trainer came back at that very version (resumed from its state): the sampler stopped
    with "version 3 could not be loaded" though the new trainer served it. A failure counts
    only for the trainer incarnation it happened under."""
    weights, status, receiver = _on_a_stand_in_trainer(tmp_path, lambda n: None)
    reload = weights.reload

    def failing_first(version: int) -> None:
        if receiver.asked:
            return reload(version)
        receiver.asked.append(version)  # the trainer died mid-fetch; its successor is at 3 too
        weights.failed_reloads[version] = "tcp://trainer: the weights server is gone"
        weights.failed_under[version] = status.restarts
        status.restarts = 1  # heard between the failure's record and the sampler's next look

    weights.reload = failing_first  # type: ignore[method-assign]
    weights.serve(lambda: 3)
    assert receiver.asked == [3, 3] and weights.version == 3 and receiver.forgotten == [3]
