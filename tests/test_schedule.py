"""The learning-rate schedule (grpo/trainer/schedule.py): its shape, and that the trainer's
DeepSpeed engine follows it step by step (a real ZeRO-2 engine on one gloo rank)."""

from __future__ import annotations

import math

import pytest

from grpo.config import ConfigError, load_config
from grpo.trainer.schedule import lr_factor, optimizer_steps


def test_warmup_then_each_schedule_ends_at_its_floor():
    for schedule in ("constant", "linear", "cosine"):
        f = [lr_factor(s, 4, 20, schedule, 0.1) for s in range(20)]
        assert f[:4] == [0.25, 0.5, 0.75, 1.0]  # linear from 0, train.lr at the last warmup step
        if schedule == "constant":
            assert f[4:] == [1.0] * 16
            continue
        assert f[4] == 1.0 and all(a >= b for a, b in zip(f[4:], f[5:], strict=False))
        assert lr_factor(20, 4, 20, schedule, 0.1) == pytest.approx(0.1)  # the floor, at the end
    half = lr_factor(12, 4, 20, "cosine", 0.0)
    assert half == pytest.approx(0.5) and lr_factor(12, 4, 20, "linear", 0.0) == 0.5
    assert lr_factor(0, 0, 10, "cosine", 0.0) == 1.0  # no warmup: train.lr at once
    assert lr_factor(25, 0, 10, "linear", 0.2) == pytest.approx(0.2)  # never below the floor


def test_the_run_s_optimizer_steps_and_bad_values():
    cfg = load_config(None, ["rollout.questions_per_step=4", "rollout.group_size=4",
                             "train.total_steps=10", "train.mini_batch_size=8",
                             "train.ppo_epochs=2"])  # fmt: skip
    assert optimizer_steps(cfg, world=2) == 10 * 2 * 2  # 8 sequences per rank, 4 per step
    for bad in ("train.lr_warmup_steps=-1", "train.lr_min_ratio=1.5"):
        with pytest.raises(ConfigError, match="train.lr_warmup_steps must be >= 0"):
            load_config(None, [bad])


@pytest.mark.slow
def test_the_policy_engine_follows_the_schedule(tiny_model_dir, monkeypatch):
    """The learning rate DeepSpeed's optimizer uses at each step is the schedule's."""
    import torch
    import torch.distributed as dist

    from grpo.trainer.engines import policy_engine

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(k, v)
    cfg = load_config(None, ["model.dtype=float32", "rollout.questions_per_step=2",
                             "rollout.group_size=2", "train.total_steps=3", "train.lr=1e-3",
                             "train.lr_warmup_steps=2", "train.lr_schedule=cosine",
                             "train.lr_min_ratio=0.1"])  # fmt: skip
    engine, _ = policy_engine(cfg, tiny_model_dir, world=1)
    try:
        seen = []
        for _ in range(optimizer_steps(cfg, 1)):
            seen.append(engine.get_lr()[0])
            ids = torch.tensor([[1, 2, 3, 4]])
            engine.backward(engine(ids, labels=ids).loss)
            engine.step()
        want = [1e-3 * lr_factor(s, 2, 3, "cosine", 0.1) for s in range(3)]
        assert seen == pytest.approx(want) and not math.isclose(seen[0], seen[1])
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
