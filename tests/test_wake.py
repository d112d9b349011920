"""The wake (issue 63's list): a sampler waiting for a version looks again the moment the
version is in, not at its wait's next 5-s look. Through the real SamplerEndpoint, and the
endpoint's weights link as it wires the endpoint's wake into the weights mode's receiver."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from grpo.config import TransportConfig, load_config
from grpo.delivery.sampler_endpoint import SamplerEndpoint
from grpo.delivery.spool import Spool
from grpo.models.shared_policy import SharedPolicy
from grpo.weights.in_use import WeightsInUse
from tests.conftest import free_port


def test_a_wait_looks_again_as_soon_as_it_is_woken(tmp_path) -> None:
    """No trainer here, so no heartbeat wakes the wait: only wake() can, 0.3 s in."""
    cfg = TransportConfig(episodes_addr=f"tcp://127.0.0.1:{free_port()}",
                          control_addr=f"tcp://127.0.0.1:{free_port()}", heartbeat_s=0.1,
                          peer_timeout_s=30, startup_timeout_s=30)  # fmt: skip
    sampler = SamplerEndpoint(cfg, "sampler-0", Spool(tmp_path, max_batches=4))
    came = threading.Event()

    def version_comes_in() -> None:
        time.sleep(0.3)
        came.set()
        sampler.wake()

    try:
        threading.Thread(target=version_comes_in, daemon=True).start()
        began = time.monotonic()
        sampler.wait_until(came.is_set, "version 1")
        took = time.monotonic() - began
    finally:
        sampler.close()
    assert 0.25 < took < 2.0, took  # the wait's own next look is 5 s away


def test_the_sampler_hands_its_endpoint_s_wake_to_the_weights_receiver(tmp_path) -> None:
    """The wiring, through the real SamplerEndpoint.weights_link and WeightsInUse.connect: the
    mode's receiver is told to wake the endpoint's waits (a receiver given anything else is
    waited out at every version)."""
    cfg = load_config(None, [f"output_dir={tmp_path}"])
    weights = WeightsInUse(cfg, SharedPolicy(cfg, tmp_path))
    links = []

    def build(cfg, link):
        links.append(link)
        return SimpleNamespace(close=lambda: None)

    weights.mode = SimpleNamespace(from_memory=False, receiver=build)
    transport = TransportConfig(episodes_addr=f"tcp://127.0.0.1:{free_port()}",
                                control_addr=f"tcp://127.0.0.1:{free_port()}")  # fmt: skip
    sampler = SamplerEndpoint(transport, "sampler-0", Spool(tmp_path / "spool", max_batches=4))
    try:
        weights.connect(sampler.weights_link(tmp_path, weights.seed()), sampler, engine=None)
    finally:
        sampler.close()
    (link,) = links
    sampler._news.clear()
    link.wake()
    assert sampler._news.is_set()  # what the endpoint's waits look at
