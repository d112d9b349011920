"""grpo.trainer.state: a training state becomes visible only once it is durable, and the
previous one is kept until then (finding 9).

DeepSpeed is replaced by an engine that writes a few files per tag and checks them when loaded,
and torch.distributed by a world of one: what is tested is the order of the file operations."""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.delivery.ledger import Ledger
from grpo.trainer import state

FINGERPRINT = {"world": 1, "questions_per_step": 2, "group_size": 2, "lora": False, "critic": True}


class Crash(Exception):
    """Stands for the process dying at this point."""


class Crasher:
    """Counts the points of a save (each file written, fsync, rename, removal) and raises
    Crash at point `at` (None: never)."""

    def __init__(self, at: int | None = None):
        self.at, self.seen = at, 0

    def point(self) -> None:
        self.seen += 1
        if self.at is not None and self.seen > self.at:
            self.at = None  # one crash per save
            raise Crash(f"crashed at point {self.seen - 1}")


def payload(tag: str, name: str, i: int) -> bytes:
    return f"{name} {tag} shard {i}\n".encode() * 64


class FakeEngine:
    """DeepSpeed's part of a save: a few files per tag under the dir it is given; loading
    refuses a tag whose files are missing or differ from what was saved."""

    def __init__(self, name: str, crasher: Crasher):
        self.name, self.crasher = name, crasher

    def zero_optimization_stage(self) -> int:
        return 2

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict, save_latest: bool):
        where = Path(save_dir) / tag
        where.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            self.crasher.point()
            (where / f"shard{i}.pt").write_bytes(payload(tag, self.name, i))
        self.crasher.point()
        (where / "client.json").write_text(json.dumps(client_state))

    def load_checkpoint(self, load_dir: str, tag: str) -> tuple[str | None, dict]:
        where = Path(load_dir) / tag
        if not where.is_dir():
            return None, {}
        for i in range(2):
            if (where / f"shard{i}.pt").read_bytes() != payload(tag, self.name, i):
                raise AssertionError(f"{where} shard {i} is damaged")
        return str(where), json.loads((where / "client.json").read_text())


@pytest.fixture
def world_of_one(monkeypatch):
    monkeypatch.setattr(
        state, "dist", types.SimpleNamespace(get_rank=lambda: 0, barrier=lambda: None)
    )


def client(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "version": step,
        "kl_reward_coef": 0.1,
        "ledger": Ledger().consumed_json(),
    }


def engines(crasher: Crasher) -> dict[str, FakeEngine]:
    return {"policy": FakeEngine("policy", crasher), "critic": FakeEngine("critic", crasher)}


def save(state_dir: Path, step: int, crasher: Crasher) -> None:
    state.save(state_dir, step, engines(crasher), client(step), FINGERPRINT)


def loaded_step(state_dir: Path) -> int | None:
    resumed = state.load(state_dir, engines(Crasher()), FINGERPRINT)
    return None if resumed is None else resumed.step


def armed(monkeypatch, crasher: Crasher) -> None:
    """Every file operation of a save is a point where the process can die."""
    for module, name in ((os, "fsync"), (os, "replace"), (os, "rename"), (shutil, "rmtree"),
                         (torch, "save")):  # fmt: skip
        real = getattr(module, name)

        def wrapped(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            crasher.point()
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)


def test_a_crash_anywhere_in_a_save_leaves_the_previous_or_the_new_state(
    tmp_path, monkeypatch, world_of_one
):
    """finding 9: whatever point of a save the process dies at, the state COMPLETE names is
    whole (the previous one, or the new one), and the next save goes through."""
    points = None
    at = 0
    while points is None or at < points:
        state_dir = tmp_path / f"crash{at}"
        save(state_dir, 1, Crasher())
        crasher = Crasher(at)
        with monkeypatch.context() as m:
            armed(m, crasher)
            try:
                save(state_dir, 2, crasher)
                points = crasher.seen  # no crash: every point was passed
            except Crash:
                pass
        assert loaded_step(state_dir) in (1, 2), f"crash at point {at}"
        save(state_dir, 3, Crasher())  # a resumed run saves again over what the crash left
        assert loaded_step(state_dir) == 3
        assert sorted(p.name for p in state_dir.glob("step*")) == ["step000003"]
        at += 1
    assert points > 10  # the crash was tried at every file operation of a whole save


def test_files_and_dirs_are_fsynced_before_the_marker_names_them(
    tmp_path, monkeypatch, world_of_one
):
    """finding 9: DeepSpeed's files, the RNG files and every directory holding them are
    fsynced before COMPLETE is replaced; COMPLETE's own file before its rename, and the state
    dir after it, before the previous state is removed."""
    state_dir = tmp_path / "train_state"
    save(state_dir, 1, Crasher())
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_rmtree = os.fsync, os.replace, shutil.rmtree

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst, **kwargs)

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        events.append(("rmtree", str(path)))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    save(state_dir, 2, Crasher())

    marker = str(state_dir / state.TRAIN_STATE_MARKER)
    visible = events.index(("replace", marker))
    before = {path for kind, path in events[:visible] if kind == "fsync"}
    new = [state_dir / "step000002", state_dir / "critic" / "step000002"]
    files = [p for d in new for p in d.rglob("*") if p.is_file()]
    assert len(files) == 7  # 2 x (two shards + client state), and the RNG file
    dirs = [*new, state_dir / "critic", state_dir]
    unsynced = [str(p) for p in [*files, *dirs] if str(p) not in before]
    assert not unsynced, f"not fsynced before {marker} named them: {unsynced}"
    # COMPLETE's temporary file was written and fsynced just before its rename...
    assert events[visible - 1][0] == "fsync" and events[visible - 1][1].startswith(
        str(state_dir / f".{state.TRAIN_STATE_MARKER}")
    )
    # ...and the rename made durable (the state dir fsynced) before step 1 is removed.
    after = events[visible + 1 :]
    removed = [i for i, (kind, _) in enumerate(after) if kind == "rmtree"]
    assert removed, "the previous state was not removed"
    assert ("fsync", str(state_dir)) in after[: removed[0]]
    assert loaded_step(state_dir) == 2
    assert not (state_dir / "step000001").exists()


def test_metrics_truncation_is_durable(tmp_path, monkeypatch):
    """finding 9: the metrics rows a resume drops are replaced durably (file, then dir)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 5)))
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert state.truncate_metrics(path, 2) == 2
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert synced[-1] == str(tmp_path)
