"""Weights over ZeroMQ: chunked, checksummed, versioned copies into the sampler's own run dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo.core.versions import verify_version, version_dir
from grpo.delivery.versions import publish_version
from grpo.wire import messages, weight_stream
from grpo.wire.codec import Message
from grpo.wire.sampler_channel import SamplerChannel
from grpo.wire.trainer_channel import TrainerChannel
from grpo.wire.weight_stream import CHUNK_BYTES, _reply
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
    cfg = _cfg(
        peer_timeout_s=10, startup_timeout_s=10, weights_addr=f"tcp://127.0.0.1:{free_port()}"
    )
    trainer = TrainerChannel(cfg, run_dir=tmp_path / "trainer")
    sampler = SamplerChannel(cfg, "s0")
    yield trainer, sampler, tmp_path
    sampler.close()
    trainer.close()


def test_a_version_arrives_in_chunks_and_checks_out(channels, monkeypatch):
    trainer, sampler, tmp = channels
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
    local = sampler.weights.fetch(tmp / "sampler", 3, keep=2)
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
    assert sampler.weights.fetch(tmp / "sampler", 3, keep=2) == local
    assert served == []  # intact: no transfer, not even the manifest asked for
    for v in (4, 5):
        _publish(tmp / "trainer", v, 1000)
        sampler.weights.fetch(tmp / "sampler", v, keep=2)
    assert sorted(p.name for p in (tmp / "sampler/versions").iterdir()) == ["v000004", "v000005"]


def test_missing_or_corrupt_versions_are_not_installed(channels):
    trainer, sampler, tmp = channels
    with pytest.raises(ValueError, match="could not fetch version 9: the trainer cannot serve it"):
        sampler.weights.fetch(tmp / "sampler", 9, keep=2)
    source = _publish(tmp / "trainer", 1, 5000)
    data = bytearray((source / "model.safetensors").read_bytes())
    data[10] ^= 1  # rots on the trainer's disk after its manifest was written
    (source / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        sampler.weights.fetch(tmp / "sampler", 1, keep=2)
    assert not version_dir(tmp / "sampler", 1).exists()
    # The fetcher still works afterwards.
    _publish(tmp / "trainer", 2, 5000)
    verify_version(sampler.weights.fetch(tmp / "sampler", 2, keep=2))


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
    sampler = SamplerChannel(cfg, "s0")  # no trainer at all
    try:
        with pytest.raises(ValueError, match="no answer from the trainer's weights server"):
            sampler.weights.fetch(tmp_path, 1, keep=2)
    finally:
        sampler.close()


@pytest.mark.slow
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
