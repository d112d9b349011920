"""Shared fixtures: the converted embedded model and a tiny random model built from a config."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF dir (converted from the packaged GGUF on first use)."""
    from grpo.models import ensure_embedded_base

    return ensure_embedded_base()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, base_model_dir) -> Path:
    """A ~3 M parameter random Llama with SmolLM2's tokenizer: real weights, no download."""
    from grpo.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", base_model_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transport_overrides(timeout_s: float = 60) -> list[str]:
    """Fresh loopback ports per run, so tests never meet a previous run's sockets."""
    return [
        f"transport.episodes_addr=tcp://127.0.0.1:{free_port()}",
        f"transport.control_addr=tcp://127.0.0.1:{free_port()}",
        f"train.master_port={free_port()}",
        f"transport.peer_timeout_s={timeout_s}",
        "transport.startup_timeout_s=300",
        "transport.heartbeat_s=0.5",
    ]


def run_launch(
    config: Path | str, overrides: list[str], timeout: float, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, "PYTHON": PYTHON, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        ["bash", str(REPO / "launch.sh"), str(config), *overrides],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
