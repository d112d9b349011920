"""The trainer's durable state: DeepSpeed engines, step, version, RNG, ledger of batches.

    train_state/step000040/     DeepSpeed's files (model, optimizer, scheduler, per rank),
                                rng_rank<r>.pt, critic/ (PPO), versions/ (stream: the
                                versions before it a resumed sampler may ask for)
    train_state/COMPLETE        {"tag", "step", "world", ...}: written last, atomically

A state is complete only once every rank has written its part and made it durable (every file
and every directory holding one fsynced), and rank 0 has then replaced COMPLETE durably (its
file fsynced, renamed, the state dir fsynced). A crash mid-save, a power loss included, leaves
the previous COMPLETE naming the previous state, which is kept until the new COMPLETE is on
disk, so a half-written state is never loaded. Only the state COMPLETE names is kept after a
save: the samplers delete the batches it acknowledges.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.core.durable import TRAIN_STATE_MARKER, fsync_path, fsync_tree, write_atomic
from grpo.core.resume import require_same
from grpo.delivery.ledger import Ledger

log = logging.getLogger("grpo.trainer")


@dataclass
class ResumedTraining:
    step: int
    version: int
    kl_reward_coef: float
    ledger: Ledger
    where: Path  # the state's own dir (what `save`'s `keep` put there is in it)


def fingerprint(cfg: Config, world: int, critic: bool) -> dict[str, Any]:
    """What a saved state must share with this run to be resumed (ZeRO-2 shards the
    optimizer per rank, so the world size is one of them)."""
    return {
        "world": world,
        "questions_per_step": cfg.rollout.questions_per_step,
        "group_size": cfg.rollout.group_size,
        "lora": cfg.model.lora.enabled,
        "critic": critic,
    }


def tag_of(step: int) -> str:
    return f"step{step:06d}"


def read_marker(state_dir: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((state_dir / TRAIN_STATE_MARKER).read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:  # written atomically, so this means someone edited it
        raise ValueError(
            f"{state_dir / TRAIN_STATE_MARKER} is not valid JSON ({e}): cannot resume"
        ) from None
    return marker


def with_zero_stage(fingerprint: dict[str, Any], engines: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint plus the policy's ZeRO stage: DeepSpeed lays out the state of stage 3
    (per-rank parameter partitions) differently from stages 0-2, and loading one as the other
    fails in DeepSpeed with a bare AssertionError (it finds none of the files it expects)."""
    return {**fingerprint, "zero_stage": engines["policy"].zero_optimization_stage()}


def save(
    state_dir: Path,
    step: int,
    engines: dict[str, Any],
    client_state: dict[str, Any],
    fingerprint: dict[str, Any],
    keep: Callable[[Path], None] | None = None,
) -> None:
    """Every rank calls this; returns once the state is complete on disk. `keep(dir)`: what
    else rank 0 saves with this state, into its own dir (durable with it, gone with it)."""
    tag, rank = tag_of(step), dist.get_rank()
    fingerprint = with_zero_stage(fingerprint, engines)
    wheres = [state_dir if name == "policy" else state_dir / name for name in engines]
    for where, engine in zip(wheres, engines.values(), strict=True):
        engine.save_checkpoint(str(where), tag=tag, client_state=client_state, save_latest=False)
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, state_dir / tag / f"rng_rank{rank}.pt")
    if keep is not None and rank == 0:
        keep(state_dir / tag)
    # DeepSpeed writes without fsync. Each rank syncs everything there after its own writes,
    # so every file is synced by the rank that wrote it (a clean file's fsync costs nothing);
    # then the dirs above the tags, which hold their names.
    for where in wheres:
        fsync_tree(where / tag)
    for where in dict.fromkeys([*wheres, state_dir]):
        fsync_path(where)
    dist.barrier()  # every rank's shards are durable before the state is declared complete
    if rank == 0:
        marker = {"tag": tag, "step": step, **fingerprint}
        write_atomic(state_dir / TRAIN_STATE_MARKER, json.dumps(marker) + "\n")
        # Only now is the new state the one a restart finds, power loss or not.
        for old in [*state_dir.glob("step*"), *state_dir.glob("*/step*")]:
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(
    state_dir: Path, engines: dict[str, Any], fingerprint: dict[str, Any]
) -> ResumedTraining | None:
    """Restore the state COMPLETE names; None if there is none. Refuses a state saved by a
    different world size or batch shape, saying which key differs."""
    marker = read_marker(state_dir)
    if marker is None:
        return None
    fingerprint = with_zero_stage(fingerprint, engines)
    # A state saved before the stage was recorded is not checked for it.
    marker.setdefault("zero_stage", fingerprint["zero_stage"])
    require_same(
        marker,
        fingerprint,
        f"the trainer from {state_dir}",
        "start with the same value, or with train.resume=never for a new run",
    )
    tag, rank = marker["tag"], dist.get_rank()
    client: dict[str, Any] = {}
    for name, engine in engines.items():
        where = state_dir if name == "policy" else state_dir / name
        path, client = engine.load_checkpoint(str(where), tag=tag)
        if path is None:
            raise ValueError(f"cannot resume: DeepSpeed found no {name} state {tag} in {where}")
    rng = torch.load(state_dir / tag / f"rng_rank{rank}.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return ResumedTraining(
        step=int(client["step"]),
        version=int(client["version"]),
        kl_reward_coef=float(client["kl_reward_coef"]),
        ledger=Ledger.from_acks(client["ledger"]),
        where=state_dir / tag,
    )


TAIL_BLOCK = 1 << 16  # bytes read at a time from a file's end (truncate_metrics)


def truncate_metrics(path: Path, step: int, key: str = "step") -> int:
    """Drop the rows whose `key` (a step, or an eval's version) is after `step`: a crashed run
    made them, the resumed one redoes them. Returns how many were dropped. Rows are appended in
    step order, so only the file's tail is read, back to the last row at or before `step`, and
    the file is cut there, durably (a torn last line goes with it): samples.jsonl of a long run
    is gigabytes, which were once read whole."""
    if not path.exists():
        return 0
    dropped = 0
    with path.open("rb+") as f:
        end = cut = f.seek(0, 2)
        for start, line in _lines_from_the_end(f, end):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None  # a torn line from a killed process: dropped, not counted
            if row is not None and not (isinstance(row, dict) and row.get(key, 0) > step):
                break
            dropped += row is not None
            cut = start
        if cut < end:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
            fsync_path(path.parent)
    return dropped


def _lines_from_the_end(f: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """The non-empty lines of `f` before offset `end`, last first, each with its offset."""
    pos, partial = end, b""  # partial: a line's end whose start lies before pos
    while pos > 0:
        start = max(0, pos - TAIL_BLOCK)
        f.seek(start)
        lines, offsets, at = (f.read(pos - start) + partial).split(b"\n"), [], start
        for line in lines:
            offsets.append(at)
            at += len(line) + 1
        whole = 1 if start > 0 else 0  # lines[0] may begin before `start`: read on for it
        for line, at in zip(reversed(lines[whole:]), reversed(offsets[whole:]), strict=True):
            if line.strip():
                yield at, line
        partial, pos = (lines[0] if whole else b""), start
