"""Sampler and trainer in two network namespaces joined by a veth pair, as on two nodes:
TCP with CURVE on, weights streamed (the sampler writes only to its own output_dir). The run
completes, and a third process without an authorised key is refused. Needs root (ip netns);
skipped with the reason otherwise, except under CI=true, where a skip fails the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.wire.keys import generate
from tests.conftest import PYTHON, REPO
from tests.test_chaos import finish, wait_for
from tests.test_integration import tiny_config

# The only test of CURVE between two hosts: CI must run it (tests/ci_skips.py).
pytestmark = [pytest.mark.slow, pytest.mark.must_run_in_ci]

TRAINER_IP, SAMPLER_IP = "10.77.0.1", "10.77.0.2"

INTRUDER = """
import sys, time, zmq, zmq.auth
from grpo.wire.codec import Message, encode_message
addr, trainer_key = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
for curve in (True, False):  # an unauthorised key that knows the trainer's, then no CURVE
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDTIMEO, 200)
    if curve:
        s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
        s.curve_serverkey = zmq.auth.load_certificate(trainer_key)[0]
    s.connect(addr)
    for _ in range(10):
        try:
            s.send_multipart(encode_message(Message("heartbeat", {"sampler_id": "intruder"})))
        except zmq.Again:
            pass
        time.sleep(0.1)
    s.close()
ctx.term()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def namespaces():
    """Two namespaces and a veth pair between them; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces (ip netns)")
    tag = os.getpid() % 100000
    a, b = f"grpoT{tag}", f"grpoS{tag}"
    try:
        _ip("netns", "add", a)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"this machine does not allow network namespaces: {getattr(e, 'stderr', e)}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", f"vt{tag}", "type", "veth", "peer", "name", f"vs{tag}")
        for ns, dev, ip in ((a, f"vt{tag}", TRAINER_IP), (b, f"vs{tag}", SAMPLER_IP)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _in_ns(ns: str, argv: list[str], log: Path, role: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHON": PYTHON, "PYTHONUNBUFFERED": "1"}
    if role:
        env["ROLE"] = role
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv], cwd=REPO, env=env,
        stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def test_two_namespaces_with_curve(tmp_path, tiny_model_dir, namespaces):
    trainer_ns, sampler_ns = namespaces
    keys = tmp_path / "keys"
    generate(keys, samplers=1)
    config = tiny_config(tmp_path, tiny_model_dir, train={"total_steps": 2, "num_ranks": 1})
    overrides = [
        f"transport.episodes_addr=tcp://{TRAINER_IP}:5555",
        f"transport.control_addr=tcp://{TRAINER_IP}:5556",
        f"transport.weights_addr=tcp://{TRAINER_IP}:5557",
        f"transport.curve_dir={keys}",
        "transport.heartbeat_s=0.5",
        "transport.peer_timeout_s=60",
        "transport.startup_timeout_s=300",
    ]
    launch = ["bash", str(REPO / "launch.sh"), str(config), *overrides]
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "sampler", "intruder")}
    trainer = _in_ns(trainer_ns, launch, logs["trainer"], "trainer")
    procs = [trainer]
    try:
        wait_for(lambda: "listening on" in logs["trainer"].read_text(), "the trainer", procs)
        intruder = _in_ns(
            sampler_ns,
            [sys.executable, "-c", INTRUDER, f"tcp://{TRAINER_IP}:5555", str(keys / "trainer.key")],
            logs["intruder"],
        )
        assert intruder.wait(timeout=60) == 0, logs["intruder"].read_text()
        time.sleep(1)
        own_dir = [*launch, f"output_dir={tmp_path / 'sampler_node'}"]
        sampler = _in_ns(sampler_ns, own_dir, logs["sampler"], "sampler")
        procs.append(sampler)
        finish(procs, timeout=400)
    finally:
        finish(procs, timeout=1)
    text = {r: p.read_text() for r, p in logs.items()}
    assert trainer.returncode == 0 and sampler.returncode == 0, text["trainer"][-3000:]
    assert "refused a peer with an unauthorised CURVE key" in text["trainer"]
    assert "security handshake failed" in text["trainer"]
    assert "fetched version 1 from" in text["sampler"]
    assert (tmp_path / "sampler_node/tiny/versions/v000001/model.safetensors").is_file()
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert {r["sampler_id"] for r in rows} == {"sampler-0"}
