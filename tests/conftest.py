"""Shared fixtures: the converted embedded model and a tiny random model built from a config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bench.common
from grpo.runtime.host_memory import keep_freed_memory

REPO = Path(__file__).resolve().parent.parent

pytest_plugins = ["tests.ci_skips"]
PYTHON = sys.executable

# One thread per process, in the test workers and every process their runs start: the
# parallelism comes from pytest-xdist's workers, and OpenMP threads of one run spinning while
# another run's processes want the same cores cost CPU time and change nothing tested.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# As the workers do (grpo/runtime/host_memory.py): the tests' own forwards and backwards are faster.
keep_freed_memory()


EXTENDED = "extended"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        f"--{EXTENDED}",
        action="store_true",
        help="also run the extended tier: long end-to-end variants CI leaves out (docs/testing.md)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --extended, the tests marked `extended` are deselected (CI's run must stay
    within its minutes on 2 cores; each of them repeats, end to end, what a test CI keeps
    already shows, or runs a benchmark's code at quick sizes).

    Then the slow tests first, each kind in collection order. pytest-xdist hands its workers
    the xdist groups first (most tests first), then the other tests in collection order: a run
    of tens of seconds handed out last keeps one worker busy while the other has nothing left,
    and the many short tests, last, end both workers' queues together. (Every worker collects
    in this same order, which xdist requires.)"""
    if not config.getoption(EXTENDED):
        left_out = [item for item in items if item.get_closest_marker(EXTENDED)]
        if left_out:
            items[:] = [item for item in items if not item.get_closest_marker(EXTENDED)]
            config.hook.pytest_deselected(items=left_out)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    """SmolLM2-135M-Instruct as an HF dir (converted from the packaged GGUF on first use)."""
    from grpo.models.convert import ensure_embedded_base

    return ensure_embedded_base()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, base_model_dir) -> Path:
    """A ~3 M parameter random Llama with SmolLM2's tokenizer: real weights, no download."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", base_model_dir)


@pytest.fixture(scope="session")
def tiny_vllm_model_dir(tmp_path_factory, base_model_dir) -> Path:
    """The tiny model with heads vLLM's CPU attention takes (32 dimensions, not 16)."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", base_model_dir, heads=2)


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory, base_model_dir) -> Path:
    """The tiny model with a reward head (one label), as reward models are."""
    from tests.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("rm") / "rm", base_model_dir, reward_head=True)


# One definition of fresh loopback ports, shared with the benchmarks.
free_port = bench.common.free_port
transport_overrides = bench.common.loopback_overrides


def run_launch(
    config: Path | str, overrides: list[str], timeout: float, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
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
