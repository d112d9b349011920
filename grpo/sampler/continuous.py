"""Continuous generation (rollout.mode: continuous): answers in flight in a fixed number of
slots, refilled by whole groups as slots free up; new weights between two decode steps; batches
cut from complete groups in the order they complete.

Pacing, not dropping. Batch b may hold answers whose oldest token is at least
required_version(b) old (train.max_staleness). Groups complete in any order, so a group in
flight may land in any later batch: the n-th group from now (the complete ones first) lands in
batch `landing(n)` at the latest. A new group is admitted only while every group in flight,
the new one included, would still meet its bound there; else the slots wait and the answers in
flight go on decoding. Nothing finished is discarded by a lone sampler; with several (whose
batch numbers move with the others') a group past its bound when its batch is cut is
discarded, counted, and its length reported beside the trained ones' (a bias toward short
answers shows).

Versions. A lone sampler loads the version its next group needs exactly when it needs it and
waits there for it, so which tokens each version samples never depends on timing (as the
lock-step sampler's batches): a deterministic run repeats. Several samplers load the newest
version out whenever the next group needs a newer one, without waiting while answers are in
flight.

Resume. At every batch cut the engine rebuilds the cache of the answers in flight from their
tokens, and the cut's state (answers in flight, complete groups not yet cut, the weights
version, the admission counter) is written before the batch is spooled. A resumed sampler
loads that version, restores the answers into their slots (the same rebuild) and goes on: with
the HF engine, bit for bit as the run that was not interrupted (tests/test_continuous_runs.py);
vLLM continues them, not bit for bit (grpo.rollout.vllm_continuous).
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
from grpo.rollout.continuous import Answer, ContinuousEngine, Request
from grpo.runtime.progress import ACTIVITY, GENERATING
from grpo.sampler.data import Prompt, Shard
from grpo.sampler.episodes import BatchMaker, Group
from grpo.sampler.weights import Weights, required_version

log = logging.getLogger("grpo.sampler")

STATE_PREFIX = "continuous-"


@dataclass
class Flying:
    """One group in flight: its question and its answers' records (appended by the engine)."""

    prompt: Prompt
    answers: list[Answer]
    admitted: int  # the weights version when it was admitted: its oldest possible

    @property
    def done(self) -> bool:
        return all(a.done for a in self.answers)


@dataclass
class Complete:
    """A group whose answers all finished, scored, waiting for its batch."""

    group: Group
    answers: list[Answer]

    @property
    def oldest(self) -> int:
        """The version of its oldest token."""
        return min((a.versions[0] for a in self.answers if a.versions), default=0)

    @property
    def tokens(self) -> int:
        return sum(len(a.tokens) for a in self.answers)


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
        self.flying: list[Flying] = []  # in admission order
        self.complete: list[Complete] = []  # in completion order
        self.saved_version = 0  # the weights version of a resumed state
        self.restored: list[Answer] = []  # a resumed state's answers in flight
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
        """The batch the n-th group from now (0: the oldest complete one) lands in at the
        latest, when this sampler's next batch is the run's batch `first`: Q groups a batch,
        the other live samplers' batches in between."""
        return first + n // self.cfg.rollout.questions_per_step * max(alive, 1)

    def needed(self, batch: int) -> int:
        """The oldest version batch `batch` may hold."""
        t = self.cfg.train
        return required_version(batch, t.max_staleness, t.sync_interval)

    def oldest_flying(self) -> int | None:
        return min((f.admitted for f in self.flying), default=None)

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
        Q = self.cfg.rollout.questions_per_step
        while not stopped():
            first, alive = next_batch()
            while len(self.complete) >= Q and (batch := self.cut(engine, seq, first)):
                send(batch)
                seq += 1
                first, alive = next_batch()
            self.admit(engine, first, alive, groups_wanted())
            if not engine.in_flight():
                if len(self.complete) < Q and groups_wanted() <= len(self.complete):
                    return seq  # the run needs no more than it has
                continue
            self.step(engine)
        return seq

    def admit(self, engine: ContinuousEngine, first: int, alive: int, wanted: int) -> None:
        """Whole groups into the free slots while the bound allows (see the module)."""
        G = self.cfg.rollout.group_size
        while len(engine.free_slots()) >= G and len(self.flying) + len(self.complete) < wanted:
            n = len(self.complete) + len(self.flying)
            need = self.needed(self.landing(n, first, alive))
            oldest = self.oldest_flying()
            if oldest is not None and oldest < need:
                self.paced += 1  # an older group could be pushed past its bound: wait
                return
            if engine.version < need and not self.update(engine, need, first, alive):
                self.paced += 1
                return
            self.start_group(engine, self.shard.draw(1)[0])

    def start_group(self, engine: ContinuousEngine, prompt: Prompt) -> None:
        G, r = self.cfg.rollout.group_size, self.cfg.rollout
        requests = [
            Request(uid, prompt.ids, answer_seed(r.seed, uid), r.max_new_tokens)
            for uid in range(self.uid, self.uid + G)
        ]
        self.uid += G
        self.flying.append(Flying(prompt, engine.admit(requests), engine.version))

    def update(self, engine: ContinuousEngine, need: int, first: int, alive: int) -> bool:
        """Load version `need` (or, with several samplers, the newest) between two steps;
        whether the engine has it now. A lone sampler waits for it when it is bound to come
        (the batches it needs are sent), else goes on decoding: both never depend on timing."""
        alone = self.cfg.rollout.num_samplers == 1
        if alone and need > first:
            return False  # it needs a batch this sampler has not cut yet
        status = self.weights.endpoint.status if self.weights.endpoint else None
        if not alone and engine.in_flight() and (status is None or status.version < need):
            return False
        before = self.weights.version
        self.weights.wait_for_version(lambda: need)
        if self.weights.version != before:
            engine.weights_changed(self.weights.version)
        return engine.version >= need

    def step(self, engine: ContinuousEngine) -> None:
        """One decode step; answers that finished complete their groups, which are scored."""
        ACTIVITY.enter(GENERATING, f"{len(engine.in_flight())} answers in flight")
        busy = len(engine.in_flight())
        t0 = time.monotonic()
        finished = engine.step()
        self.step_s += time.monotonic() - t0
        self.steps += 1
        self.busy += busy
        self.tokens += sum(len(a.tokens) for a in finished)
        if engine.stop_event.is_set():
            return
        if finished:
            self.collect()

    def collect(self) -> None:
        """Groups whose answers all finished leave the flight, scored, in admission order among
        those that finished in the same step."""
        done = [f for f in self.flying if f.done]
        if not done:
            return
        self.flying = [f for f in self.flying if not f.done]
        for f in done:
            gens = [a.generation() for a in f.answers]
            group = self.batches.score_groups([f.prompt], gens)[0]
            self.complete.append(Complete(group, f.answers))

    def cut(self, engine: ContinuousEngine, seq: int, batch: int) -> EpisodeBatch | None:
        """Batch `seq` (the run's batch `batch`) from the oldest complete groups that meet its
        bound; the others are discarded. None when fewer than Q are left."""
        Q, need = self.cfg.rollout.questions_per_step, self.needed(batch)
        late = [c for c in self.complete if c.oldest < need]
        for c in late:
            self.discarded_lengths += [len(a.tokens) for a in c.answers]
            log.warning("discarded a group of question %d: its oldest token is version %d, "
                        "batch %d needs %d or newer", c.group.prompt.index, c.oldest, batch,
                        need)  # fmt: skip
        self.complete = [c for c in self.complete if c.oldest >= need]
        if len(self.complete) < Q:
            return None
        chosen, self.complete = self.complete[:Q], self.complete[Q:]
        for c in chosen:
            self.trained_lengths += [len(a.tokens) for a in c.answers]
        engine.rebuild_cache()  # what a resume from here does: it decodes on the same
        stats = self.cut_stats(engine, late, chosen)
        version = min(c.oldest for c in chosen)
        return self.batches.batch(seq, [c.group for c in chosen], version, stats)

    def cut_stats(
        self, engine: ContinuousEngine, late: list[Complete], chosen: list[Complete]
    ) -> dict[str, float]:
        steps = max(self.steps, 1)
        stats = {
            "gen_s": self.step_s,
            "gen_tokens": float(self.tokens),
            "in_flight_answers": float(len(engine.in_flight())),
            "slot_occupancy": self.busy / (steps * engine.slots),
            "paced_share": self.paced / steps,
            "groups_discarded": float(len(late)),
            "answers_discarded_total": float(len(self.discarded_lengths)),
            "answer_len_trained_mean": float(np.mean(self.trained_lengths or [0])),
            "answer_len_discarded_mean": float(np.mean(self.discarded_lengths or [0])),
            # The first question of the batch (data_end, the shard's position, as lock-step's).
            "data_start": float(min(c.group.prompt.position for c in chosen)),
        }
        self.step_s, self.tokens, self.steps, self.paced, self.busy = 0.0, 0, 0, 0, 0
        return stats

    # ------------------------------------------------------------------ resume

    def state(self, engine: ContinuousEngine) -> dict[str, Any]:
        """What a resumed sampler needs to go on from this cut (JSON-able)."""
        return {
            "uid": self.uid,
            "version": self.weights.version,
            "flying": [
                {
                    "position": f.prompt.position,
                    "admitted": f.admitted,
                    "answers": [a.to_state() for a in f.answers],
                }
                for f in self.flying
            ],  # fmt: skip
            "complete": [
                {
                    "position": c.group.prompt.position,
                    "scored": c.group.scored,
                    "answers": [a.to_state() for a in c.answers],
                }
                for c in self.complete
            ],  # fmt: skip
        }

    def save(self, spool_dir: Path, seq: int, engine: ContinuousEngine) -> None:
        """The state after cutting batch `seq`, written before the batch is spooled; older
        ones removed."""
        path = spool_dir / f"{STATE_PREFIX}{seq:09d}.json"
        write_atomic(path, json.dumps(self.state(engine)).encode())
        for old in spool_dir.glob(f"{STATE_PREFIX}*.json"):
            if old != path:
                old.unlink(missing_ok=True)

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
        for f in s["flying"]:
            answers = [Answer.from_state(a) for a in f["answers"]]
            self.flying.append(Flying(self.shard.prompt_at(f["position"]), answers, f["admitted"]))
            self.restored += answers
        for c in s["complete"]:
            answers = [Answer.from_state(a) for a in c["answers"]]
            scored = [(float(r), dict(info)) for r, info in c["scored"]]
            group = Group(self.shard.prompt_at(c["position"]),
                          [a.generation() for a in answers], scored)  # fmt: skip
            self.complete.append(Complete(group, answers))
        log.info("resuming %d answers in flight and %d complete groups at version %d",
                 len(self.restored), len(self.complete), self.saved_version)  # fmt: skip

    def resume_into(self, engine: ContinuousEngine) -> None:
        """A resumed state's weights and answers into a new engine."""
        if self.saved_version != self.weights.version:
            self.weights.wait_for_version(lambda: self.saved_version)
        if self.weights.version != engine.version:
            engine.weights_changed(self.weights.version)
        if self.restored:
            engine.restore(self.restored)
            self.restored = []
