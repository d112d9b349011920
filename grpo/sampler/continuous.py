"""Continuous generation (rollout.mode: continuous): answers in flight in a fixed number of
slots, refilled by whole groups as slots free up; new weights between two decode steps; batches
cut from complete groups in the order they were admitted.

Batches in admission order. This sampler's k-th batch holds its groups kQ to (k+1)Q - 1 (Q =
rollout.questions_per_step): a group's batch is known when it is admitted, and a long answer
holds up its own batch's cut, never the slots, which go on taking the next batches' groups.

Pacing, not dropping. Batch b may only hold answers whose oldest token is at least
required_version(b) (train.max_staleness). A group is admitted only when the weights in the
engine meet the bound of the batch it lands in; else its slots wait, and the answers in flight
go on decoding. A lone sampler never discards a finished answer. With several, the run's batch
numbers move with the others' batches, so a group's batch is an estimate: a group past its
bound when its batch is cut is discarded, counted, and its length reported beside the trained
ones' (a bias toward short answers shows).

Versions. After the cut of batch b the sampler waits for the version batch b + 2 needs (b + 1
when train.max_staleness < 2: b + 2's would need batch b trained), as the lock-step sampler
waits before each batch, and loads it under the answers in flight: they decode on with the new
weights, so an answer's tokens may come from several versions (each token records its own, and
its behaviour log-prob). Two batches' groups may then be in flight. A lone sampler loads
exactly that version, so which tokens each version samples never depends on timing: a
deterministic run repeats. Several samplers load the newest out.

Resume. At every batch cut the engine rebuilds the cache of the answers in flight from their
tokens (rollout.exact_resume), and the cut's state (the groups not yet cut, their answers, the
weights version, the admission counter) is written before the batch is spooled. A resumed
sampler loads that version, restores the answers into their slots (the same rebuild), loads
the version its next batch needs as the uninterrupted sampler did after spooling, and goes on:
with the HF engine, bit for bit as the run that was not interrupted
(tests/test_continuous_runs.py). Without the rebuild, or with vLLM (grpo.rollout.
vllm_continuous), a resume continues the answers from their tokens, not bit for bit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo.config import Config
from grpo.core.durable import write_atomic
from grpo.core.episode import EpisodeBatch
from grpo.core.staleness import required_version
from grpo.rollout.continuous import Answer, ContinuousEngine, Request
from grpo.runtime.progress import ACTIVITY, GENERATING
from grpo.sampler.data import Shard
from grpo.sampler.episodes import BatchMaker, Group
from grpo.sampler.weights import Weights
from grpo.tasks.encoding import Prompt

log = logging.getLogger("grpo.sampler")

STATE_PREFIX = "continuous-"


@dataclass
class Admitted:
    """One group admitted: its question, its answers' records (the engine appends to them) and,
    once they all finished, their scores."""

    prompt: Prompt
    answers: list[Answer]
    admitted: int  # the weights version when it was admitted: its oldest possible
    drawn: tuple[int, int]  # the shard positions its draw spanned, [start, end): skips too
    group: Group | None = None  # scored, once every answer finished

    @property
    def finished(self) -> bool:
        return all(a.done for a in self.answers)

    @property
    def oldest(self) -> int:
        """The version of its oldest token."""
        return min((a.versions[0] for a in self.answers if a.versions), default=self.admitted)


def answer_seed(run_seed: int, uid: int) -> int:
    """Answer `uid`'s sampling seed: a pure function of the run's seed and its admission
    number, so a resumed run draws the same tokens."""
    return (run_seed * 1_000_003 + uid) % 2**62


class ContinuousLoop:
    """The continuous sampler's state and its loop; `Sampler` (grpo.sampler.loop) builds it
    and hands it the engine, the endpoint's waits and the batches' delivery."""

    def __init__(self, cfg: Config, shard: Shard, batches: BatchMaker, weights: Weights):
        self.cfg = cfg
        self.shard = shard
        self.batches = batches
        self.weights = weights
        self.uid = 0  # answers admitted so far
        self.groups: list[Admitted] = []  # admitted and not yet cut, in admission order
        self.saved_version = 0  # the weights version of a resumed state
        self.restored: list[Answer] = []  # a resumed state's answers in flight
        t = cfg.train
        # Load after the cut of batch b the version batch b + ahead needs (see the module).
        self.ahead = 2 if (t.max_staleness or 0) >= 2 else 1
        # Metrics: since the last cut, and totals of the run for the length bias.
        self.step_s = 0.0
        self.tokens = 0
        self.steps = 0
        self.paced = 0  # steps with free slots that the bound kept empty
        self.busy = 0  # slot-steps with an answer in them
        self.trained_lengths: list[int] = []
        self.discarded_lengths: list[int] = []

    # ------------------------------------------------------------------ the bound

    def landing(self, n: int, first: int, alive: int) -> int:
        """The run's batch the n-th group not yet cut lands in (exact for a lone sampler)."""
        return first + n // self.cfg.rollout.questions_per_step * max(alive, 1)

    def needed(self, batch: int) -> int:
        """The oldest version batch `batch` may hold."""
        t = self.cfg.train
        return required_version(batch, t.max_staleness, t.sync_interval)

    # ------------------------------------------------------------------ the loop

    def run(
        self,
        engine: ContinuousEngine,
        next_batch: Callable[[], tuple[int, int]],
        groups_wanted: Callable[[], int],
        send: Callable[[EpisodeBatch], None],
        stopped: Callable[[], bool],
        seq: int,
    ) -> int:
        """Generate and cut batches until `groups_wanted()` is 0 and nothing is left to cut,
        or `stopped()`. next_batch(): (the run's batch this sampler's next one is, live
        samplers); send(batch) spools and sends it with the state. Returns the next seq."""
        self.resume_into(engine)
        self.load_for(engine, next_batch()[0] - 1 + self.ahead)
        while not stopped():
            first, alive = next_batch()
            while batch := self.cut(engine, seq, first):
                send(batch)
                seq += 1
                first, alive = next_batch()
                self.load_for(engine, first - 1 + self.ahead)
            self.admit(engine, first, alive, groups_wanted())
            if not engine.in_flight():
                if groups_wanted() <= len(self.groups):
                    return seq  # the run needs no more than it has
                continue
            self.step(engine)
        return seq

    def load_for(self, engine: ContinuousEngine, batch: int) -> None:
        """Wait for the version batch `batch` needs; load it under the answers in flight."""
        self.weights.wait_for_version(lambda: self.needed(batch))
        if self.weights.version != engine.version:
            engine.weights_changed(self.weights.version)

    def admit(self, engine: ContinuousEngine, first: int, alive: int, wanted: int) -> None:
        """Whole groups into the free slots while the engine's weights meet the bound of the
        batch each lands in (see the module)."""
        G = self.cfg.rollout.group_size
        while len(engine.free_slots()) >= G and len(self.groups) < wanted:
            batch = self.landing(len(self.groups), first, alive)
            if engine.version < self.needed(batch):
                if engine.in_flight() or self.cfg.rollout.num_samplers == 1:
                    self.paced += 1  # wait for the next cut's version, decoding meanwhile
                    return
                self.load_for(engine, batch)  # several: the others' batches moved the bound
            self.start_group(engine)

    def start_group(self, engine: ContinuousEngine) -> None:
        """The next question's G answers into free slots."""
        G, r = self.cfg.rollout.group_size, self.cfg.rollout
        start = self.shard.position
        prompt = self.shard.draw(1)[0]
        requests = [
            Request(uid, prompt.ids, answer_seed(r.seed, uid), r.max_new_tokens)
            for uid in range(self.uid, self.uid + G)
        ]
        self.uid += G
        drawn = (start, self.shard.position)
        self.groups.append(Admitted(prompt, engine.admit(requests), engine.version, drawn))

    def step(self, engine: ContinuousEngine) -> None:
        """One decode step; groups whose answers all finished are scored."""
        ACTIVITY.enter(GENERATING, f"{len(engine.in_flight())} answers in flight")
        busy = len(engine.in_flight())
        t0 = time.monotonic()
        finished = engine.step()
        self.step_s += time.monotonic() - t0
        self.steps += 1
        self.busy += busy
        self.tokens += sum(len(a.tokens) for a in finished)
        if engine.stop_event.is_set() or not finished:
            return
        for g in self.groups:
            if g.group is None and g.finished:
                gens = [a.generation() for a in g.answers]
                g.group = self.batches.score_groups([g.prompt], gens)[0]

    def cut(self, engine: ContinuousEngine, seq: int, batch: int) -> EpisodeBatch | None:
        """Batch `seq` (the run's batch `batch`) from the first Q groups in admission order,
        once they are all scored; with several samplers, a group among them that misses the
        bound is discarded and the next one takes its place. None while they are not."""
        Q, need = self.cfg.rollout.questions_per_step, self.needed(batch)
        chosen: list[Admitted] = []
        late: list[Admitted] = []
        for g in self.groups:
            if g.group is None or len(chosen) == Q:
                break
            (late if g.oldest < need else chosen).append(g)
        for g in late:
            self.discarded_lengths += [len(a.tokens) for a in g.answers]
            log.warning("discarded a group of question %d: its oldest token is version %d, "
                        "batch %d needs %d or newer", g.prompt.index, g.oldest, batch,
                        need)  # fmt: skip
        self.groups = [g for g in self.groups if g not in late]
        if len(chosen) < Q:
            return None
        self.groups = self.groups[Q:]
        self.trained_lengths += [len(a.tokens) for g in chosen for a in g.answers]
        if self.cfg.rollout.exact_resume:
            engine.rebuild_cache()  # what a resume from here does: it decodes on the same
        stats = self.cut_stats(engine, len(late), chosen)
        version = min(g.oldest for g in chosen)
        return self.batches.batch(seq, [g.group for g in chosen if g.group], version, stats)

    def cut_stats(
        self, engine: ContinuousEngine, late: int, chosen: list[Admitted]
    ) -> dict[str, float]:
        steps = max(self.steps, 1)
        stats = {
            "gen_s": self.step_s,
            "gen_tokens": float(self.tokens),
            "in_flight_answers": float(len(engine.in_flight())),
            "slot_occupancy": self.busy / (steps * engine.slots),
            "paced_share": self.paced / steps,
            "groups_discarded": float(late),
            "answers_discarded_total": float(len(self.discarded_lengths)),
            "answer_len_trained_mean": float(np.mean(self.trained_lengths or [0])),
            "answer_len_discarded_mean": float(np.mean(self.discarded_lengths or [0])),
            # The shard positions the batch's questions were drawn from, as lock-step's.
            "data_start": float(chosen[0].drawn[0]),
            "data_end": float(chosen[-1].drawn[1]),
        }
        self.step_s, self.tokens, self.steps, self.paced, self.busy = 0.0, 0, 0, 0, 0
        return stats

    # ------------------------------------------------------------------ resume

    def load(self, spool_dir: Path, seq: int) -> None:
        """The state saved with batch `seq - 1` (none: a fresh start at seq 0)."""
        if seq == 0:
            return
        path = spool_dir / f"{STATE_PREFIX}{seq - 1:09d}.json"
        try:
            s = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(
                f"cannot resume the continuous sampler at batch {seq}: {path} is missing"
            ) from None
        self.uid, self.saved_version = int(s["uid"]), int(s["version"])
        for g in s["groups"]:
            prompt = self.shard.prompt_at(g["position"])
            answers = [Answer.from_state(a) for a in g["answers"]]
            start, end = (int(x) for x in g["drawn"])
            admitted = Admitted(prompt, answers, int(g["admitted"]), (start, end))
            if g["scored"] is not None:
                scored = [(float(r), dict(info)) for r, info in g["scored"]]
                admitted.group = Group(prompt, [a.generation() for a in answers], scored)
            self.groups.append(admitted)
            self.restored += [a for a in answers if not a.done]
        log.info("resuming %d answers in flight in %d groups at version %d",
                 len(self.restored), len(self.groups), self.saved_version)  # fmt: skip

    def resume_into(self, engine: ContinuousEngine) -> None:
        """A resumed state's weights and answers into a new engine."""
        if self.saved_version != self.weights.version:
            self.weights.wait_for_version(lambda: self.saved_version)
        if self.weights.version != engine.version:
            engine.weights_changed(self.weights.version)
        if self.restored:
            engine.restore(self.restored)
            self.restored = []


def save_state(loop: ContinuousLoop, spool_dir: Path, seq: int) -> None:
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


def cut_state(loop: ContinuousLoop) -> dict[str, Any]:
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
