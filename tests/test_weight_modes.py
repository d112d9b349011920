"""The registry of weights modes (grpo.weights.modes): every mode of the config has one, and
each mode's two ends, built as a run builds them, move a published version from the trainer's
Publisher to a sampler's receiver whole, over real sockets where the mode has them."""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import zmq
from safetensors.torch import save_file

from grpo.config import Config, WeightsConfig, load_config
from grpo.config.weights import streams_versions
from grpo.weights.modes import MODES
from grpo.weights.modes.base import SamplerLink, Unavailable
from grpo.weights.publisher import Published, Publisher
from grpo.wire.channels import SocketLimits
from tests.conftest import free_port


def test_every_mode_of_the_config_is_registered_and_says_where_it_keeps_versions():
    named = set(typing.get_args(typing.get_type_hints(WeightsConfig)["mode"])) - {"auto"}
    assert set(MODES) == named
    for name, mode in MODES.items():
        cfg = Config()
        cfg.weights.mode = name  # type: ignore[assignment]
        assert mode.name == name and mode.from_memory == streams_versions(cfg), name


def _state(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {f"layer.{i}.weight": torch.randn(64, 32, generator=g) for i in range(3)}


class Waiter:
    """A sampler's wait as its endpoint's (SamplerEndpoint.wait_until): it looks again only
    when woken. The endpoint's also wakes on each message of the trainer; here nothing else
    wakes it, so a receiver that does not wake it when a version came in is waited out."""

    def __init__(self) -> None:
        self.news = threading.Event()

    def wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while not ready():
            woken = self.news.wait(max(0.0, deadline - time.monotonic()))
            assert woken, f"no {what} within 20 s: nothing woke the wait"
            self.news.clear()

    def wake(self) -> None:
        self.news.set()


def _link(run_dir: Path, ctx: zmq.Context) -> SamplerLink:
    """A sampler's link as SamplerEndpoint.weights_link makes it."""
    waiter = Waiter()
    return SimpleNamespace(  # a SamplerLink
        run_dir=run_dir, sampler_id="sampler-0", ctx=ctx, keys=None,
        limits=SocketLimits(1 << 30, 4), secure=lambda sock: None, newest_version=lambda: 1,
        wait=waiter.wait, wake=waiter.wake, seed=None,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["shared_dir", "files", "stream"])
def test_each_mode_hands_the_sampler_the_version_the_trainer_published(tmp_path, mode):
    overrides = [f"weights.mode={mode}", f"output_dir={tmp_path / 'trainer'}"]
    if mode != "shared_dir":
        overrides.append(f"transport.weights_addr=tcp://127.0.0.1:{free_port()}")
    cfg = load_config(None, overrides)
    tokenizer = SimpleNamespace(save_pretrained=lambda where: None)
    publisher, failures = Publisher(cfg, tokenizer), []
    publisher.start(SimpleNamespace(published=0, members=dict, failed=failures.append))
    state = _state(1)
    weights = Published(lambda where, shard: save_file(state, where / "model.safetensors"),
                        lambda: state)  # fmt: skip
    ctx = zmq.Context()
    # shared_dir reads the trainer's run dir; files copies into the sampler's own.
    run_dir = cfg.run_dir if mode == "shared_dir" else tmp_path / "sampler"
    receiver = MODES[mode].receiver(cfg, _link(run_dir, ctx))
    try:
        publisher.publish(weights, 1)
        # the weights body of the trainer's next heartbeat (grpo.delivery.trainer_endpoint
        # sends it whole, the sampler's endpoint hands it to the receiver)
        receiver.heard(publisher.announced(), restarted=False)
        version = receiver.get(1)  # stream: the follower wakes the wait once it holds it
        assert version is not None and version.number == 1 and not version.adapter
        assert version.tensors().keys() == state.keys()
        assert all(torch.equal(version.tensors()[k], v) for k, v in state.items())
        # From a version dir exactly where the mode keeps one (vLLM then reads its files).
        assert (version.vdir is not None) == (mode != "stream")
        if mode != "stream":  # a version never published: said, not waited for
            with pytest.raises(Unavailable):
                receiver.get(7)
    finally:
        receiver.close()
        ctx.term()
        publisher.close()
    assert failures == []


@pytest.mark.parametrize("given", ["someone/tiny-model", "embedded", "dir"])
def test_a_published_adapter_names_a_base_another_machine_finds(tmp_path, given):
    """Issue 64, item 6: a LoRA version's adapter_config.json named the base by the path peft
    loaded it from, for a hub id this machine's cache snapshot, which no other machine has.
    The publisher names it as the config does ('embedded', the hub id), a dir absolutely."""
    import json

    from grpo.weights.dirs import verify_version, version_dir

    model = tmp_path / "mine"
    model.mkdir()
    (model / "config.json").write_text("{}")
    path = str(model) if given == "dir" else given
    cfg = load_config(None, [f"output_dir={tmp_path / 'run'}", f"model.path={path}",
                             "model.lora.enabled=true", "weights.mode=shared_dir"])  # fmt: skip
    snapshot = "/root/.cache/huggingface/hub/models--someone--tiny-model/snapshots/0123abcd"
    state = _state(1)

    def write(where: Path, shard: str) -> None:  # as peft's save_pretrained writes an adapter
        save_file(state, where / "adapter_model.safetensors")
        settings = {"base_model_name_or_path": snapshot, "r": 4, "peft_type": "LORA"}
        (where / "adapter_config.json").write_text(json.dumps(settings))

    publisher = Publisher(cfg, SimpleNamespace(save_pretrained=lambda where: None))
    publisher.start(SimpleNamespace(published=0, members=dict, failed=lambda cause: None))
    try:
        publisher.publish(Published(write, lambda: state), 1)
    finally:
        publisher.close()
    vdir = version_dir(cfg.run_dir, 1)
    settings = json.loads((vdir / "adapter_config.json").read_text())
    assert settings == {"base_model_name_or_path": str(model.resolve()) if given == "dir"
                        else given, "r": 4, "peft_type": "LORA"}  # fmt: skip
    verify_version(vdir)  # its checksums are of the file as rewritten


def test_the_sampler_holds_the_version_its_receiver_handed_over(tmp_path):
    """With relays a receiver may hand over a newer version than the one asked for
    (grpo.weights.stream.follower.VersionFollower.image): the sampler's version, which its
    batches carry, is the one it loaded."""
    from grpo.models.shared_policy import SharedPolicy
    from grpo.weights.in_use import WeightsInUse
    from grpo.weights.modes.base import Receiver
    from grpo.weights.version import Version

    class Newer(Receiver):
        def get(self, number: int) -> Version:
            return Version(number + 2, adapter=False, state={})

    cfg = Config(output_dir=str(tmp_path))
    weights = WeightsInUse(cfg, SharedPolicy(cfg, tmp_path / "model"))
    weights.receiver = Newer()
    weights.reload(3)
    assert weights.version == 5


def test_a_served_version_goes_into_every_consumer_that_samples_with_it(tmp_path):
    """WeightsInUse.serve, the sampler's one call per version: it waits for the version the
    pacing needs, receives it and loads it into the engine (the HF policy too once something
    loaded it), and returns the version now served."""
    import threading
    from types import SimpleNamespace

    from grpo.models.shared_policy import SharedPolicy
    from grpo.weights.in_use import WeightsInUse
    from grpo.weights.modes.base import Receiver
    from grpo.weights.version import Version

    class Engine:
        def __init__(self) -> None:
            self.loaded: list[int] = []

        def load(self, version: Version) -> None:
            self.loaded.append(version.number)

    class Whole(Receiver):
        def get(self, number: int) -> Version:
            return Version(number, adapter=False, state={})

    cfg = Config(output_dir=str(tmp_path))
    weights = WeightsInUse(cfg, SharedPolicy(cfg, tmp_path / "model"))
    weights.mode = SimpleNamespace(receiver=lambda cfg, link: Whole())  # type: ignore[assignment]
    status = SimpleNamespace(version=4, restarts=0)
    trainer = SimpleNamespace(status=status, stopped=threading.Event(),
                              wait_until=lambda ready, what: None)  # fmt: skip
    engine = Engine()
    weights.connect(None, trainer, engine)  # type: ignore[arg-type]
    assert weights.serve(lambda: 4) == 4 and engine.loaded == [4]
    assert weights.serve(lambda: 4) == 4 and engine.loaded == [4]  # served already: no reload
