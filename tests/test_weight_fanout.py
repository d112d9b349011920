"""Weight fan-out over real loopback sockets, one process per receiver (bench/weight_fanout.py
at small sizes): the trainer sends a version about once to a tree of relaying receivers, and a
relay SIGKILLed mid-version is routed around, its restarted process catching up from its parent."""

from __future__ import annotations

import subprocess
import sys

from bench.weight_fanout import QUICK, chaos, fan_out, network
from tests.conftest import REPO


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
