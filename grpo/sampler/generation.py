"""The sampler's one generation loop: whole groups admitted into an engine's slots
(grpo.rollout.slots), decode steps until answers finish, each group scored once all its answers
have, and batches cut from the scored groups and sent.

When groups are admitted, which version they are sampled with, and when a batch is cut is the
pacing's (grpo.sampler.pacing, by rollout.mode): lock-step generates each batch whole with one
version; continuous keeps the slots full and loads versions under the answers in flight. The
loop itself is the same for both, and for every engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from grpo.config import Config
from grpo.core.episode import EpisodeBatch
from grpo.core.staleness import required_version
from grpo.rollout.slots import Answer, SlotEngine, SlotRequest
from grpo.runtime.progress import ACTIVITY, GENERATING
from grpo.sampler.data import Shard
from grpo.sampler.episodes import BatchMaker, Group
from grpo.tasks.encoding import Prompt
from grpo.weights.in_use import WeightsInUse
from grpo.wire.channels import PeerError


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


class RunView(Protocol):
    """What the loop asks of the run (grpo.sampler.loop.SamplerRun, on the sampler's
    endpoint)."""

    def next_batch(self) -> tuple[int, int]:
        """(The run's batch number this sampler's next batch is expected to be, live
        samplers.)"""
        ...

    def groups_wanted(self) -> int:
        """Groups the run still needs of this sampler."""
        ...

    def wait_for_room(self) -> None:
        """Until the spool takes another batch."""
        ...

    def send(self, batch: EpisodeBatch) -> None:
        """Spool and send a batch."""
        ...

    def stopped(self) -> bool: ...


class Pacing(Protocol):
    """When groups enter the engine, which weights they meet, and when a batch is cut; and
    what a resume needs of a cut."""

    def resume(self, loop: GenerationLoop, spool_dir: Path) -> None:
        """Before the run: the state saved with batch loop.seq - 1 into the loop."""
        ...

    def save(self, loop: GenerationLoop, spool_dir: Path) -> None:
        """The state after cutting batch loop.seq, before the batch is spooled."""
        ...

    def finish(self, spool_dir: Path) -> None:
        """The run is done: remove what a resume would have read."""
        ...

    def start(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """Once, before the first step: the weights (and a resumed state) into the engine."""
        ...

    def admit(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """Groups into free slots (loop.start_group), loading the version they need first."""
        ...

    def cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> EpisodeBatch | None:
        """Batch loop.seq from scored groups, taking them out of loop.groups; None: not yet."""
        ...

    def after_cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """Right after a batch was sent."""
        ...


class GenerationLoop:
    """The groups admitted and not yet cut, the engine's steps, and the counters a batch's
    metrics report; `pacing` decides the rest (see the module)."""

    def __init__(
        self, cfg: Config, shard: Shard, batches: BatchMaker, weights: WeightsInUse, pacing: Pacing
    ):
        self.cfg = cfg
        self.shard = shard
        self.batches = batches
        self.weights = weights
        self.pacing = pacing
        self.seq = 0  # this sampler's next batch
        self.uid = 0  # answers admitted so far
        self.groups: list[Admitted] = []  # admitted and not yet cut, in admission order
        # Counters since the last cut.
        self.step_s = 0.0
        self.tokens = 0  # sampled by the model (a tool's results are not)
        self.steps = 0
        self.busy = 0  # slot-steps with an answer in them

    def run(self, engine: SlotEngine, run: RunView, seq: int) -> int:
        """Generate and cut batches from `seq` on until `run.groups_wanted()` is met and nothing
        is left to cut, or `run.stopped()`. Returns the next seq."""
        self.seq = seq
        self.pacing.start(self, engine, run)
        while not run.stopped():
            while batch := self.pacing.cut(self, engine, run):
                run.send(batch)
                self.seq += 1
                self.pacing.after_cut(self, engine, run)
            self.pacing.admit(self, engine, run)
            if not engine.in_flight():
                if run.groups_wanted() <= len(self.groups):
                    break  # the run needs no more than this sampler has
                continue
            self.step(engine)
        return self.seq

    # ------------------------------------------------------------------ versions

    def needed(self, batch: int) -> int:
        """The oldest version the run's batch `batch` may hold (train.max_staleness)."""
        t = self.cfg.train
        return required_version(batch, t.max_staleness, t.sync_interval)

    def load_for(self, engine: SlotEngine, needed: Callable[[], int]) -> None:
        """Wait until the version `needed()` is out and load it (into the engine too)."""
        served = self.weights.serve(needed)
        assert engine.version == served, "an engine the weights never loaded"

    # ------------------------------------------------------------------ groups

    def start_group(self, engine: SlotEngine, seed: Callable[[int], int]) -> None:
        """The next question's G answers into free slots; answer `uid` sampled with
        `seed(uid)`."""
        r = self.cfg.rollout
        start = self.shard.position
        prompt = self.shard.draw(1)[0]
        uids = range(self.uid, self.uid + r.group_size)
        requests = [SlotRequest(uid, prompt.ids, seed(uid), r.max_new_tokens) for uid in uids]
        self.uid += r.group_size
        drawn = (start, self.shard.position)
        self.groups.append(Admitted(prompt, engine.admit(requests), engine.version, drawn))

    def step(self, engine: SlotEngine) -> None:
        """One engine step; the groups whose answers all finished are scored, together."""
        busy = len(engine.in_flight())
        ACTIVITY.enter(GENERATING, f"batch {self.seq}")  # the next batch to cut
        t0 = time.monotonic()
        finished = engine.step()
        ACTIVITY.tick()  # a step is progress, whatever the engine: what the stall check watches
        self.step_s += time.monotonic() - t0
        self.steps += 1
        self.busy += busy
        if engine.stop_event.is_set():  # a step cut short: its output must not be used
            raise PeerError("stopped during generation")
        self.tokens += sum(a.generation().sampled_tokens for a in finished)
        done = [g for g in self.groups if g.group is None and g.finished] if finished else []
        if done:
            gens = [a.generation() for g in done for a in g.answers]
            scored = self.batches.score_groups([g.prompt for g in done], gens)
            for g, group in zip(done, scored, strict=True):
                g.group = group

    def take_counters(self, engine: SlotEngine) -> dict[str, float]:
        """The generation metrics since the last cut, and their reset."""
        stats = {
            "gen_s": self.step_s,
            "gen_tokens": float(self.tokens),
            "slot_occupancy": self.busy / (max(self.steps, 1) * engine.slots),
        }
        self.step_s, self.tokens, self.steps, self.busy = 0.0, 0, 0, 0
        return stats
