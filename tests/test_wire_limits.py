"""What one peer can make this process hold, and who may listen or hold a key: the bounds of
issue 29 (findings 7 and 11) on the real codec, sockets and key files."""

from __future__ import annotations

import ast
import dataclasses
import logging
import struct
import threading
import tracemalloc
from pathlib import Path

import msgpack
import pytest
import zmq

from grpo.config import TransportConfig
from grpo.core.episode import EpisodeBatch
from grpo.weights.serving import WeightsServer
from grpo.wire import channels
from grpo.wire.channels import PeerError
from grpo.wire.codec import FrameError, Message, decode, encode_batch, encode_message, seal
from grpo.wire.keys import ClientKeys, generate, secure_server
from grpo.wire.trainer_channel import TrainerChannel
from tests.conftest import free_port
from tests.test_episode import make_batch
from tests.test_transport import _cfg

WIRE = Path(__file__).resolve().parent.parent / "grpo" / "wire"


def _peak_per_byte(header: bytes) -> float:
    """tracemalloc's peak while decoding a message whose header is `header`, per header byte."""
    frames = seal(header)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(FrameError):
            decode(frames)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / len(header)


def test_a_header_of_empty_maps_costs_little_more_than_its_size():
    """finding 7: 1 MiB of empty msgpack maps (one byte each, 64 bytes each as Python dicts)
    cost ~72 MiB to decode; the unpacking is bounded by the header's size, not only its lengths."""
    n = 1 << 20
    bare = b"\xdd" + struct.pack(">I", n - 5) + b"\x80" * (n - 5)
    # The same maps under a key of a well-formed header map, where a batch has its lists.
    keyed = b"\x81\xa6reward" + b"\xdd" + struct.pack(">I", n - 13) + b"\x80" * (n - 13)
    for header in (bare, keyed):
        assert _peak_per_byte(header) < 16


def test_nested_arrays_cannot_claim_memory_they_do_not_carry():
    """finding 7: msgpack allocates an array's declared length before its elements arrive, so
    1,000 nested array headers of 5 bytes each, each declaring as many elements as the header
    has bytes, cost ~8,000 times their size (a 1 MiB header of them: gigabytes)."""
    depth = 1000
    header = (b"\xdd" + struct.pack(">I", depth * 5)) * depth
    assert _peak_per_byte(header) < 64


def test_bounded_unpacking_still_decodes_every_message_kind():
    """finding 7: the bounds refuse no real message: a batch, a heartbeat with acknowledgements
    and a weights manifest decode to what was sent."""
    batch = make_batch(seed=0)
    got = decode(encode_batch(batch))
    assert isinstance(got, EpisodeBatch)
    assert got.columns.reward.tolist() == batch.columns.reward.tolist()
    assert got.columns.reward_info == batch.columns.reward_info
    body = {
        "version": 3,
        "acks": {f"sampler-{i}": {"low": 40, "extra": list(range(42, 2000, 2))} for i in range(8)},
        "alive": [f"sampler-{i}" for i in range(8)],
        "manifest": {"files": {f"model-{i}.safetensors": {"bytes": 1 << 30} for i in range(50)}},
    }
    assert decode(encode_message(Message("heartbeat", body))) == Message("heartbeat", body)


def test_header_walk_refuses_what_msgpack_would_build():
    """finding 7: a header deeper than any message, or with trailing bytes, is refused."""
    deep: object = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(FrameError, match="nested"):
        decode(encode_message(Message("x", {"d": deep})))
    packed = msgpack.packb({"magic": b"x"}) + b"\x00"
    with pytest.raises(FrameError):
        decode(seal(packed))


def test_every_socket_is_made_with_size_and_queue_limits():
    """finding 7: no socket set ZMQ_MAXMSGSIZE or a receive high-water mark, so ZeroMQ
    buffered a whole message of any size before max_frame_bytes was checked. Every socket of
    grpo/wire is now made by channels.new_socket, which sets both from the config."""
    for path in WIRE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "socket":
                assert path.name == "channels.py", f"{path.name} makes a socket itself"
    limits = channels.SocketLimits.of(TransportConfig(max_frame_bytes=64 << 20))
    assert limits.max_message_bytes == 64 << 20 and limits.receive_hwm == 4
    assert channels.SocketLimits.of(TransportConfig()).receive_hwm == 2
    assert channels.SocketLimits.of(TransportConfig(receive_hwm=7)).receive_hwm == 7
    ctx = zmq.Context()
    try:
        sock = channels.new_socket(ctx, zmq.PULL, limits=limits)
        got = sock.getsockopt(zmq.MAXMSGSIZE), sock.getsockopt(zmq.RCVHWM)
        sock.close()
    finally:
        ctx.term()
    assert got == (64 << 20, 4)
    cfg = _cfg(max_frame_bytes=8 << 20, weights_addr=f"tcp://127.0.0.1:{free_port()}")
    trainer = TrainerChannel(cfg)
    try:
        assert trainer.pull.getsockopt(zmq.MAXMSGSIZE) == 8 << 20
        assert trainer.pull.getsockopt(zmq.RCVHWM) == 32
    finally:
        trainer.close()


def test_key_files_are_private_and_a_readable_secret_is_refused(tmp_path):
    """finding 11: `python -m grpo keys` wrote secret keys readable by everyone, and a secret
    key readable by others was loaded as it was."""
    keys = tmp_path / "keys"
    generate(keys, samplers=1)
    for secret in keys.glob("*.key_secret"):
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    ClientKeys.load(keys, "sampler-0")  # private: loads
    (keys / "sampler-0.key_secret").chmod(0o640)
    with pytest.raises(ValueError, match=r"readable by group or others .*chmod 600"):
        ClientKeys.load(keys, "sampler-0")
    (keys / "trainer.key_secret").chmod(0o604)
    ctx = zmq.Context()
    try:
        with pytest.raises(ValueError, match="trainer.key_secret is readable by group or others"):
            secure_server(ctx, [], keys)
    finally:
        ctx.term()


def serve_nothing(router: zmq.Socket, closing: threading.Event, failed: object) -> None:
    closing.wait()
    router.close()


def test_a_socket_beyond_loopback_without_curve_is_refused_unless_allowed(caplog):
    """finding 11: only episodes_addr warned when bound beyond loopback without CURVE; the
    weights (the full model) and control sockets said nothing. Each is now refused, naming
    the socket, unless transport.allow_insecure, which logs a warning naming each."""

    def listen(cfg: TransportConfig) -> list[TrainerChannel | WeightsServer]:
        """What a trainer binds: the episode channel, and the weights server (files mode's)."""
        trainer = TrainerChannel(cfg)
        try:
            return [trainer, WeightsServer(cfg, serve_nothing, 1 << 10, trainer.fail)]
        except PeerError:
            trainer.close()
            raise

    for key in ("episodes_addr", "control_addr", "weights_addr"):
        cfg = dataclasses.replace(_cfg(weights_addr=f"tcp://127.0.0.1:{free_port()}"),
                                  **{key: f"tcp://0.0.0.0:{free_port()}"})  # fmt: skip
        with pytest.raises(PeerError, match=f"transport.{key} .*transport.allow_insecure"):
            listen(cfg)
    cfg = dataclasses.replace(
        _cfg(weights_addr=f"tcp://0.0.0.0:{free_port()}"),
        episodes_addr=f"tcp://0.0.0.0:{free_port()}",
        allow_insecure=True,
    )
    with caplog.at_level(logging.WARNING, logger="grpo.transport"):
        for part in listen(cfg):
            part.close()
    warned = [r.getMessage() for r in caplog.records if "without CURVE" in r.getMessage()]
    assert len(warned) == 2
    assert any("transport.episodes_addr" in w for w in warned)
    assert any("transport.weights_addr" in w for w in warned)


def test_refusals_are_logged_ten_times_then_at_each_power_of_two() -> None:
    from grpo.runtime.refusals import worth_logging

    logged = [n for n in range(1, 5000) if worth_logging(n)]
    assert logged == [*range(1, 11), 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def test_a_batch_whose_sampler_id_is_no_sampler_id_is_refused() -> None:
    from grpo.core.episode import EpisodeBatch
    from grpo.wire.codec import FrameError, decode, encode_batch
    from tests.test_episode import make_batch

    made = make_batch(seed=0, num_groups=2, group_size=4, rollout=False)
    for sid in ("x" * 100, "../escape"):
        batch = EpisodeBatch.from_columns(made.columns, 4, 0, 0, sid, {})
        with pytest.raises(FrameError, match="sampler_id must be"):
            decode(encode_batch(batch))
