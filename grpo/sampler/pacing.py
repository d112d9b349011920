"""The two pacings of the generation loop (grpo.sampler.generation), by rollout.mode.

**Lock-step.** Before each batch the sampler waits for the version the batch needs (batch b may
be sampled with b - train.max_staleness or newer) and for room in its spool, loads it, admits
the batch's Q groups into the empty engine, steps until they all finish, and cuts the batch:
one version per batch. A round's seed is rollout.seed + batch + round; its first answer gets it
and each later one its own, and an engine that samples the round with one call is seeded with
the first (grpo.rollout.generate_slots). DAPO's dynamic sampling: a group whose answers all
score the same teaches nothing; another round of Q questions is sampled, up to
max_sampling_rounds, and past the cap flat groups fill the batch.

**Continuous.** Answers in flight in a fixed number of slots, refilled by whole groups as slots
free up; new weights between two decode steps; batches cut from complete groups in the order
they were admitted, each group admitted only when the engine's weights meet its batch's bound.
How and why, step by step: docs/async.md, "How the continuous sampler works". Resume:
grpo.sampler.cut_state.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from grpo.config import Config
from grpo.core.episode import EpisodeBatch
from grpo.rollout.slots import SlotEngine
from grpo.sampler.cut_state import Resumed, clear_states, load_state, restore_into, save_state
from grpo.sampler.generation import Admitted, GenerationLoop, Pacing, RunView

log = logging.getLogger("grpo.sampler")


def pacing_for(cfg: Config) -> Pacing:
    return Continuous(cfg) if cfg.rollout.mode == "continuous" else LockStep(cfg)


def answer_seed(run_seed: int, uid: int) -> int:
    """Continuous: answer `uid`'s sampling seed, a pure function of the run's seed and its
    admission number, so a resumed run draws the same tokens."""
    return (run_seed * 1_000_003 + uid) % 2**62


def round_seed(seed: int, k: int) -> int:
    """Lock-step: the seed of a round's k-th answer; the round's own for its first."""
    return (seed + k * ANSWER_SPREAD) % 2**62


ANSWER_SPREAD = 2**32  # far apart from the rounds' seeds (rollout.seed + batch + round)


class LockStep:
    """Each batch whole, with one version (see the module). A cut leaves nothing in flight, so
    a resume needs nothing but the spool's shard state."""

    def __init__(self, cfg: Config):
        r = cfg.rollout
        self.Q = r.questions_per_step
        self.seed = r.seed
        self.dynamic = r.dynamic_sampling
        self.max_rounds = r.max_sampling_rounds if r.dynamic_sampling else 1
        self.G = r.group_size
        self.rounds = 0  # of the batch being made
        self.unadmitted = 0  # groups of the round not yet admitted
        self.round_seed = self.first = 0  # the round's seed, and its first answer's uid
        self.data_start = 0

    def resume(self, loop: GenerationLoop, spool_dir: Path) -> None:
        """Nothing was in flight at the last cut."""

    def save(self, loop: GenerationLoop, spool_dir: Path) -> None:
        """Nothing is in flight at a cut."""

    def finish(self, spool_dir: Path) -> None:
        """Nothing saved."""

    def start(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """Versions are loaded before each batch."""

    def admit(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """The round's Q groups into free slots (as they free up, in an engine with fewer than
        Q x G): the batch's first round once its version is loaded and the spool has room, or
        another when cut() wants more (dynamic sampling)."""
        if not self.unadmitted:
            if engine.in_flight() or any(g.group is None for g in loop.groups):
                return  # the round is still decoding
            if not loop.groups:  # a new batch
                if run.groups_wanted() <= 0:
                    return
                loop.load_for(engine, lambda: loop.needed(run.next_batch()[0]))
                run.wait_for_room()
                if run.stopped():
                    return
                self.rounds, self.data_start = 0, loop.shard.position
            self.unadmitted, self.first = self.Q, loop.uid
            self.round_seed = self.seed + loop.seq + self.rounds * 1_000_003  # batch and round
            self.rounds += 1
        seed, first = self.round_seed, self.first
        while self.unadmitted and len(engine.free_slots()) >= self.G:
            loop.start_group(engine, lambda uid: round_seed(seed, uid - first))
            self.unadmitted -= 1

    def cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> EpisodeBatch | None:
        groups = loop.groups
        if self.unadmitted or not groups or any(g.group is None for g in groups):
            return None
        flat = [g for g in groups if self.dynamic and g.group and g.group.is_flat()]
        kept = [g for g in groups if g not in flat]
        if len(kept) < self.Q and self.rounds < self.max_rounds:
            return None  # another round (admit)
        chosen = (kept + flat)[: self.Q]  # past the cap, flat groups fill (zero advantage)
        flat_kept = sum(g in chosen for g in flat)
        stats = {
            **loop.take_counters(engine),
            "sampling_rounds": float(self.rounds),
            "groups_generated": float(len(groups)),
            "flat_groups_dropped": float(len(flat) - flat_kept),
            "flat_groups_kept": float(flat_kept),
            # Which prompts of this sampler's shard the batch drew: [data_start, data_end).
            "data_start": float(self.data_start),
        }
        loop.groups = []
        version = min(g.oldest for g in chosen)
        return loop.batches.batch(loop.seq, [g.group for g in chosen if g.group], version, stats)

    def after_cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """The next batch's version is waited for when its groups are admitted."""


class Continuous:
    """Slots kept full, versions loaded under the answers in flight (see the module); each cut's
    state saved for a resume (grpo.sampler.cut_state)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.Q = cfg.rollout.questions_per_step
        # Load after the cut of batch b the version batch b + ahead needs (see the module).
        self.ahead = 2 if (cfg.train.max_staleness or 0) >= 2 else 1
        self.paced = 0  # steps with free slots that the bound kept empty, since the last cut
        self.trained_lengths: list[int] = []  # of the run, for the length bias
        self.discarded_lengths: list[int] = []
        self.resumed = Resumed()

    def resume(self, loop: GenerationLoop, spool_dir: Path) -> None:
        self.resumed = load_state(loop, spool_dir, loop.seq)

    def save(self, loop: GenerationLoop, spool_dir: Path) -> None:
        save_state(loop, spool_dir, loop.seq)

    def finish(self, spool_dir: Path) -> None:
        clear_states(spool_dir)

    def landing(self, n: int, first: int, alive: int) -> int:
        """The run's batch the n-th group not yet cut lands in (exact for a lone sampler)."""
        return first + n // self.Q * max(alive, 1)

    def start(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        restore_into(loop, engine, self.resumed)
        self.after_cut(loop, engine, run)

    def after_cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """The version the batch `ahead` after the next one needs, under the answers in flight."""
        batch = run.next_batch()[0] - 1 + self.ahead
        loop.load_for(engine, lambda: loop.needed(batch))

    def admit(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> None:
        """Whole groups into the free slots while the engine's weights meet the bound of the
        batch each lands in (see the module)."""
        r = self.cfg.rollout
        first, alive = run.next_batch()
        wanted = run.groups_wanted()
        while len(engine.free_slots()) >= r.group_size and len(loop.groups) < wanted:
            batch = self.landing(len(loop.groups), first, alive)
            if engine.version < loop.needed(batch):
                if engine.in_flight():
                    self.paced += 1  # wait for the next cut's version, decoding meanwhile
                    return
                # Nothing to decode meanwhile (several samplers: the others' batches moved the
                # bound): the version it needs, now, rather than a loop with nothing to do.
                loop.load_for(engine, lambda b=batch: loop.needed(b))
            loop.start_group(engine, lambda uid: answer_seed(r.seed, uid))

    def cut(self, loop: GenerationLoop, engine: SlotEngine, run: RunView) -> EpisodeBatch | None:
        return self.cut_at(loop, engine, run.next_batch()[0])

    def cut_at(self, loop: GenerationLoop, engine: SlotEngine, batch: int) -> EpisodeBatch | None:
        """Batch loop.seq (the run's batch `batch`) from the first Q groups in admission order,
        once they are all scored; with several samplers, a group among them that misses the
        bound is discarded and the next one takes its place. None while they are not."""
        need = loop.needed(batch)
        chosen: list[Admitted] = []
        late: list[Admitted] = []
        for g in loop.groups:
            if g.group is None or len(chosen) == self.Q:
                break
            (late if g.oldest < need else chosen).append(g)
        for g in late:
            self.discarded_lengths += [len(a.tokens) for a in g.answers]
            log.warning(
                "discarded a group of question %d: its oldest token is version %d, "
                "batch %d needs %d or newer",
                g.prompt.index,
                g.oldest,
                batch,
                need,
            )
        loop.groups = [g for g in loop.groups if g not in late]
        if len(chosen) < self.Q:
            return None
        loop.groups = loop.groups[self.Q :]
        self.trained_lengths += [len(a.tokens) for g in chosen for a in g.answers]
        if self.cfg.rollout.exact_resume:
            engine.rebuild_cache()  # what a resume from here does: it decodes on the same
        stats = {
            "paced_share": self.paced / max(loop.steps, 1),
            **loop.take_counters(engine),
            "in_flight_answers": float(len(engine.in_flight())),
            "groups_discarded": float(len(late)),
            "answers_discarded_total": float(len(self.discarded_lengths)),
            "answer_len_trained_mean": float(np.mean(self.trained_lengths or [0])),
            "answer_len_discarded_mean": float(np.mean(self.discarded_lengths or [0])),
            # The shard positions the batch's questions were drawn from, as lock-step's.
            "data_start": float(chosen[0].drawn[0]),
            "data_end": float(chosen[-1].drawn[1]),
        }
        self.paced = 0
        version = min(g.oldest for g in chosen)
        return loop.batches.batch(loop.seq, [g.group for g in chosen if g.group], version, stats)
