"""Continuous generation's resume (grpo.sampler.pacing.Continuous): the state of a batch cut.

At every batch cut the engine rebuilds the cache of the answers in flight from their tokens
(rollout.exact_resume), and the cut's state (the groups not yet cut, their answers, the weights
version, the admission counter) is written before the batch is spooled. A resumed sampler
loads that version, restores the answers into their slots (the same rebuild), loads the
version its next batch needs as the uninterrupted sampler did after spooling, and goes on:
with the HF engine, bit for bit as the run that was not interrupted
(tests/test_continuous_runs.py). Without the rebuild, or with vLLM (grpo.rollout.
vllm_slots), a resume continues the answers from their tokens, not bit for bit.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo.core.durable import write_atomic
from grpo.rollout.slots import Answer, SlotEngine
from grpo.sampler.episodes import Group
from grpo.sampler.generation import Admitted, GenerationLoop

log = logging.getLogger("grpo.sampler")

STATE_PREFIX = "continuous-"


@dataclass
class Resumed:
    """What a saved cut puts back: the weights version it had and its answers in flight."""

    version: int = 0
    answers: list[Answer] = field(default_factory=list)


def save_state(loop: GenerationLoop, spool_dir: Path, seq: int) -> None:
    """The state after cutting batch `seq`, written before the batch is spooled. The one of
    batch seq - 1 stays until batch seq is spooled (a crash in between resumes from it);
    older ones are removed."""
    path = spool_dir / f"{STATE_PREFIX}{seq:09d}.json"
    write_atomic(path, json.dumps(cut_state(loop)).encode())
    keep = {path, spool_dir / f"{STATE_PREFIX}{seq - 1:09d}.json"}
    for old in spool_dir.glob(f"{STATE_PREFIX}*.json"):
        if old not in keep:
            old.unlink(missing_ok=True)


def clear_states(spool_dir: Path) -> None:
    """The run is done: no cut will be resumed from."""
    for path in spool_dir.glob(f"{STATE_PREFIX}*.json"):
        path.unlink(missing_ok=True)


def cut_state(loop: GenerationLoop) -> dict[str, Any]:
    """What a resumed sampler needs to go on from this cut (JSON-able)."""
    return {
        "uid": loop.uid,
        "version": loop.weights.version,
        "groups": [
            {
                "position": g.prompt.position,
                "admitted": g.admitted,
                "drawn": list(g.drawn),
                "answers": [a.to_state() for a in g.answers],
                "scored": None if g.group is None else g.group.scored,
            }
            for g in loop.groups
        ],
    }


def load_state(loop: GenerationLoop, spool_dir: Path, seq: int) -> Resumed:
    """The state saved with batch `seq - 1` into `loop` (none: a fresh start at seq 0)."""
    resumed = Resumed()
    if seq == 0:
        return resumed
    path = spool_dir / f"{STATE_PREFIX}{seq - 1:09d}.json"
    try:
        s = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"cannot resume the continuous sampler at batch {seq}: {path} is missing"
        ) from None
    loop.uid, resumed.version = int(s["uid"]), int(s["version"])
    for g in s["groups"]:
        prompt = loop.shard.prompt_at(g["position"])
        answers = [Answer.from_state(a) for a in g["answers"]]
        start, end = (int(x) for x in g["drawn"])
        admitted = Admitted(prompt, answers, int(g["admitted"]), (start, end))
        if g["scored"] is not None:
            scored = [(float(r), dict(info)) for r, info in g["scored"]]
            admitted.group = Group(prompt, [a.generation() for a in answers], scored)
        loop.groups.append(admitted)
        resumed.answers += [a for a in answers if not a.done]
    log.info(
        "resuming %d answers in flight in %d groups at version %d",
        len(resumed.answers),
        len(loop.groups),
        resumed.version,
    )
    return resumed


def restore_into(loop: GenerationLoop, engine: SlotEngine, resumed: Resumed) -> None:
    """A resumed state's weights and answers into a new engine."""
    if resumed.version != loop.weights.version:
        loop.weights.serve(lambda: resumed.version)
    if resumed.answers:
        engine.restore(resumed.answers)
        resumed.answers = []
