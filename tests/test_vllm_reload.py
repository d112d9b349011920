"""A streamed version's memory file outlives a reload that timed out (grpo.rollout.vllm): the
abandoned transfer may still have a worker open /proc/<pid>/fd/<fd>, and a number closed
under it could be reused by the next file the sampler opens. No vLLM needed: the engine's
calls are a stand-in that hangs."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from grpo.rollout.vllm import VllmRollout


class _HungEngine:
    """vLLM's client, answering no weight-transfer call until released; it records the files
    each `update_weights` named, as a worker would open them."""

    def __init__(self) -> None:
        self.release, self.entered = threading.Event(), threading.Event()
        self.finished = threading.Event()
        self.files: list[str] = []

    def collective_rpc(self, method: str, args: tuple = ()):
        if method == "update_weights":
            self.files += args[0]["files"]
            self.entered.set()
            self.release.wait(30)
        if method == "grpo_loaded":
            self.finished.set()
            return [{"version": 1, "tensors": 1}]
        return [None]


def test_the_memory_file_stays_open_until_a_timed_out_transfer_ends():
    engine = object.__new__(VllmRollout)  # its weights path only: no engine process
    hung = _HungEngine()
    engine.llm = hung
    engine.cfg = SimpleNamespace(
        rollout=SimpleNamespace(vllm=SimpleNamespace(reload_timeout_s=0.2))
    )
    engine.checkpoint = {"w": (2,)}
    with pytest.raises(TimeoutError, match="reload_timeout_s"):
        engine.load_tensors({"w": torch.ones(2)}, 1)
    assert hung.entered.wait(10)  # on a loaded machine the thread may get there after 0.2 s
    (path,) = hung.files
    fd = int(path.rsplit("/", 1)[1])
    assert _names_the_version(fd)  # still its file: a late worker reads what it was sent
    hung.release.set()
    assert hung.finished.wait(10)
    for _ in range(100):  # the transfer's thread closes it as it ends
        if not _names_the_version(fd):
            return
        time.sleep(0.05)
    raise AssertionError(f"descriptor {fd} still open after the transfer ended")


def _names_the_version(fd: int) -> bool:
    try:
        return "grpo-v1" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
