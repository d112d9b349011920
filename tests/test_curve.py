"""CURVE over real sockets: the authorised sampler gets through, anyone else is refused and
logged; `python -m grpo keys` makes the keys."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth

from grpo.wire.codec import Message, encode_message
from grpo.wire.keys import generate
from grpo.wire.sampler_channel import SamplerChannel
from grpo.wire.trainer_channel import TrainerChannel
from tests.conftest import PYTHON, REPO
from tests.test_transport import _batch, _cfg, sampler_endpoint, trainer_endpoint


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate(tmp_path / "keys", samplers=1)
    return tmp_path / "keys"


def _intruder(addr: str, curve: tuple[bytes, bytes, bytes] | None) -> None:
    """A PUSH socket sending a heartbeat that would count as a live sampler if it got in."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 500)
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = curve
    sock.connect(addr)
    try:
        for _ in range(5):
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(encode_message(Message("heartbeat", {"sampler_id": "x"})))
            time.sleep(0.1)
    finally:
        sock.close()
        ctx.term()


def test_authorised_sampler_gets_through_and_others_are_refused(keys, caplog, tmp_path):
    cfg = _cfg(peer_timeout_s=10, startup_timeout_s=10, curve_dir=str(keys))
    trainer = trainer_endpoint(cfg, version=4)
    try:
        # Strangers first: a wrong key (that knows the trainer's public key), and no CURVE.
        stranger_public, stranger_secret = zmq.curve_keypair()
        trainer_public, _ = zmq.auth.load_certificate(keys / "trainer.key")
        _intruder(cfg.episodes_addr, (stranger_public, stranger_secret, trainer_public))
        _intruder(cfg.episodes_addr, None)
        assert trainer.receive_batch(wait_s=1.0) is None
        assert not trainer.pool.members  # not even their heartbeats counted
        deadline = time.monotonic() + 5
        while trainer.channel.refused_handshakes < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer.channel.refused_handshakes >= 2
        assert "refused a peer with an unauthorised CURVE key" in caplog.text
        assert "security handshake failed" in caplog.text
        # The sampler with its key: batches in, the trainer's version out.
        sampler = sampler_endpoint(cfg, tmp_path / "spool", "sampler-0")
        try:
            sampler.send(_batch(0), {})
            assert trainer.receive_batch(wait_s=5).seq == 0
            deadline = time.monotonic() + 5
            while sampler.status.version != 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sampler.status.version == 4
        finally:
            sampler.close()
    finally:
        trainer.close()


def test_a_sampler_whose_key_is_added_during_the_run_joins_it(keys, tmp_path):
    """The pool grows under CURVE too: `python -m grpo keys DIR --add sampler-1` while the
    trainer runs, and sampler-1's batches are taken in its own name (the trainer reads
    authorized/ again when an unknown key connects); a key it never authorised still is not."""
    cfg = _cfg(peer_timeout_s=10, startup_timeout_s=10, curve_dir=str(keys))
    trainer = trainer_endpoint(cfg, version=0)
    try:
        add = [PYTHON, "-m", "grpo", "keys", str(keys), "--add", "sampler-1"]
        made = subprocess.run(add, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        sampler = sampler_endpoint(cfg, tmp_path / "spool", "sampler-1")
        try:
            sampler.send(_batch(0, "sampler-1"), {})
            batch = trainer.receive_batch(wait_s=10)
            assert batch is not None and batch.sampler_id == "sampler-1"
            assert trainer.channel.refused_messages == 0
        finally:
            sampler.close()
        refused = subprocess.run([*add[:-1], "no such id!"], cwd=REPO, capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 2 and "is no sampler id" in refused.stderr
    finally:
        trainer.close()


def test_authorized_keys_are_read_again_on_any_change(keys, tmp_path):
    """Issue 62 (medium): authorized/ was read again only when an unknown key appeared and the
    directory's mtime had moved, so a deleted key was still accepted and one overwritten in
    place never seen. Any change of the key files counts now, looked at once a second."""
    import shutil

    from grpo.wire.keys import AUTHORIZED, AuthorizedKeys

    now = [0.0]
    authorized = keys / AUTHORIZED
    owners = AuthorizedKeys(authorized, clock=lambda: now[0])
    (first,) = owners.owners
    assert owners.owner(first) == "sampler-0"
    other = tmp_path / "other"
    generate(other, samplers=1)  # another pair under the same name
    (authorized / "sampler-0.key").unlink()
    assert owners.owner(first) == "sampler-0"  # within the second: not looked at yet
    now[0] = 1.0
    assert owners.owner(first) is None  # deleted: refused from now on
    shutil.copy(other / AUTHORIZED / "sampler-0.key", authorized / "sampler-0.key")
    now[0] = 2.0
    (second,) = AuthorizedKeys(authorized).owners
    assert second != first and owners.owner(second) == "sampler-0"
    shutil.copy(keys / "sampler-0.key", authorized / "sampler-0.key")  # overwritten in place
    now[0] = 3.0
    assert owners.owner(first) == "sampler-0" and owners.owner(second) is None


def test_missing_keys_are_a_clear_error(keys, tmp_path):
    cfg = _cfg(curve_dir=str(keys))
    with pytest.raises(ValueError, match="sampler sampler-7's secret key"):
        SamplerChannel(cfg, "sampler-7")
    with pytest.raises(ValueError, match="the trainer's secret key"):
        TrainerChannel(_cfg(curve_dir=str(tmp_path / "nowhere")))


def test_keys_command_writes_pairs_and_never_overwrites(tmp_path):
    run = [PYTHON, "-m", "grpo", "keys", str(tmp_path / "k"), "--samplers", "2"]
    first = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    names = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert names == ["authorized", "reward.key", "reward.key_secret", "sampler-0.key",
                     "sampler-0.key_secret", "sampler-1.key", "sampler-1.key_secret",
                     "trainer.key", "trainer.key_secret"]  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "k/authorized").iterdir()) == [
        "sampler-0.key",
        "sampler-1.key",
    ]
    again = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr


def test_a_message_counts_only_from_the_key_of_the_sampler_it_names(tmp_path, caplog):
    """sampler-1, authorised, cannot stop the run or send batches in sampler-0's name; in its
    own name it can."""
    from grpo.wire.channels import PeerError

    generate(tmp_path / "k", samplers=2)
    cfg = _cfg(peer_timeout_s=10, startup_timeout_s=10, curve_dir=str(tmp_path / "k"))
    trainer = trainer_endpoint(cfg)
    impostor = SamplerChannel(cfg, "sampler-1")
    try:
        impostor.sampler_id = "sampler-0"  # its own key, another's name
        impostor.send_stop("let me end your run")
        impostor.send_batch(_batch(0))  # the batch's own sampler_id: sampler-0
        assert trainer.receive_batch(wait_s=2) is None
        assert trainer.channel.refused_messages >= 2
        assert "a stop in the name of 'sampler-0' with the key of 'sampler-1'" in caplog.text
        assert "a batch in the name of 'sampler-0' with the key of 'sampler-1'" in caplog.text
        impostor.sampler_id = "sampler-1"
        impostor.send_stop("my own reason")
        with pytest.raises(PeerError, match="sampler sampler-1 stopped: my own reason"):
            trainer.receive_batch(wait_s=5)
    finally:
        impostor.close()
        trainer.close()


def _non_loopback_ip() -> str | None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.must_run_in_ci  # the only check of the host filter from another address
@pytest.mark.skipif(_non_loopback_ip() is None, reason="no non-loopback interface")
def test_without_curve_a_stop_counts_only_from_this_host(caplog):
    """A trainer listening beyond loopback without CURVE: a stop arriving over the host's
    network address is refused and named; over loopback it stops the run."""
    from grpo.config import TransportConfig
    from grpo.wire.channels import PeerError
    from tests.conftest import free_port

    ip, port = _non_loopback_ip(), free_port()
    cfg = TransportConfig(episodes_addr=f"tcp://0.0.0.0:{port}",
                          control_addr=f"tcp://127.0.0.1:{free_port()}", heartbeat_s=0.1,
                          peer_timeout_s=10, startup_timeout_s=10,
                          allow_insecure=True)  # fmt: skip
    trainer = trainer_endpoint(cfg)
    ctx = zmq.Context()
    try:
        for host, reason in ((ip, "from afar"), ("127.0.0.1", "from here")):
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(f"tcp://{host}:{port}")
            said = {"sampler_id": "sampler-0", "incarnation": "i"}  # a sampler's own stop
            for kind, body in (("heartbeat", said), ("stop", {**said, "reason": reason})):
                sock.send_multipart(encode_message(Message(kind, body)))
            if host == ip:
                assert trainer.receive_batch(wait_s=2) is None
                assert f"a stop from {ip}, not this host, on a port without CURVE" in caplog.text
            else:
                with pytest.raises(PeerError, match="sampler sampler-0 stopped: from here"):
                    trainer.receive_batch(wait_s=5)
            sock.close()
    finally:
        trainer.close()
        ctx.term()
