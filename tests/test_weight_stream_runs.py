"""Whole runs with weights.mode: stream: the same weights, bit for bit, as the shared-dir run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import free_port, transport_overrides


def _run(tmp_path: Path, model_dir: Path, name: str, extra: list[str]) -> tuple[Path, str]:
    from tests.test_chaos import finish, start
    from tests.test_integration import tiny_config

    (tmp_path / name).mkdir()
    config = tiny_config(tmp_path / name, model_dir, train={"num_ranks": 1})
    overrides = [*transport_overrides(), *extra]
    logs = tmp_path / name
    trainer = start("trainer", config, overrides, logs / "trainer.log")
    sampler = start("sampler", config, overrides, logs / "sampler.log")
    finish([trainer, sampler], timeout=400)
    log = (logs / "sampler.log").read_text()
    assert trainer.returncode == 0 and sampler.returncode == 0, log[-3000:]
    return logs / "runs/tiny", log


@pytest.mark.slow
def test_a_streamed_run_ends_with_the_shared_dir_runs_weights(tmp_path, tiny_model_dir):
    shared, _ = _run(tmp_path, tiny_model_dir, "shared", ["weights.mode=shared_dir"])
    addr = f"transport.weights_addr=tcp://127.0.0.1:{free_port()}"
    streamed, log = _run(tmp_path, tiny_model_dir, "stream", ["weights.mode=stream", addr])
    # Every version came from the trainer's memory, none through a version dir...
    assert "version 0 -> 1" in log and "version 1 -> 2" in log and "(streamed)" in log
    assert "fetched version" not in log and "falling back" not in log
    versions = sorted(p.name for p in (streamed / "versions").iterdir())
    assert versions == ["v000003"]  # weights.save_interval 0: the last version's dir only
    # ... and sampled exactly what the shared-dir run sampled: the same final weights.
    a = load_file(shared / "versions/v000003/model.safetensors")
    b = load_file(streamed / "versions/v000003/model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
