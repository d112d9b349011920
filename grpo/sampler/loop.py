"""The sampling loop: questions -> G answers -> rewards, log-probs -> EpisodeBatch -> trainer.

Versions: the sampler starts on version 0 (the initial weights). The trainer announces each
version it publishes in its heartbeats; before batch `seq` the sampler waits until a version
>= seq - max_staleness is out, reloads it from the run dir, and tags the batch with it.

This module wires the parts together and runs them: the questions (grpo.sampler.data), the
weights (.weights), the engine (grpo.rollout.registry.build_engine), the generation loop and
its pacing (.generation, .pacing), the batches (.episodes) and their delivery to the trainer
(the endpoint of grpo.delivery.sampler_endpoint); and it turns Ctrl-C / SIGTERM into a clean
stop. Evaluation is the trainer's (grpo.eval.in_training); with eval.engine: sampler this
sampler generates its answers when asked (.evaluation).
"""

from __future__ import annotations

import logging
import signal
import threading

from grpo.config import Config
from grpo.config.rules import eval_engine
from grpo.core.episode import EpisodeBatch
from grpo.delivery.sampler_endpoint import SamplerEndpoint, TrainerStatus
from grpo.delivery.spool import Spool
from grpo.models.loading import load_tokenizer, resolve_model_path
from grpo.models.shared_policy import SharedPolicy
from grpo.observe.metrics import mean
from grpo.rollout.base import EngineContext
from grpo.rollout.registry import build_engine
from grpo.rollout.slots import SlotEngine
from grpo.runtime.progress import terminal_bar
from grpo.sampler.data import Shard
from grpo.sampler.episodes import BatchMaker
from grpo.sampler.evaluation import SamplerEvaluation, whole_batch_engine
from grpo.sampler.generation import GenerationLoop
from grpo.sampler.pacing import pacing_for
from grpo.sampler.rewards import SamplerRewards
from grpo.tasks import task_for
from grpo.tasks.failures import RewardFailingError
from grpo.weights.in_use import WeightsInUse
from grpo.wire import messages
from grpo.wire.channels import PeerError

log = logging.getLogger("grpo.sampler")


def expected_batch(trained: dict[str, int], sampler_id: str, made: int, alive: int) -> int:
    """Which batch of the run (counted from 0) the one this sampler makes next is expected to
    be, from the trainer's last heartbeat: all batches trained so far, then this sampler's
    `made - trained[sampler_id]` still on their way, with one from each other live sampler
    between two of ours. A lone sampler's is exactly `made`. With none of its own on the way
    it is the trainer's next, so a sampler never waits for a version only its own batch could
    bring, whichever samplers died."""
    on_the_way = max(made - trained.get(sampler_id, 0), 0)
    return sum(trained.values()) + on_the_way * max(alive, 1)


class Sampler:
    """One sampler: its parts, built from the config, and the loop that drives them."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        task = task_for(cfg)
        # Reward threads (and the service's socket) for the sampler's life; run_sampler
        # closes them.
        self.rewards = SamplerRewards(cfg, task)
        model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = tokenizer = load_tokenizer(model_path)
        self.shard = Shard(cfg, task, tokenizer)
        self.spool = Spool(cfg.spool_path, cfg.rollout.spool_max_batches)
        self.next_seq = self.shard.resume(self.spool)
        self.policy = policy = SharedPolicy(cfg, model_path)
        self.weights = WeightsInUse(cfg, policy)
        self.batches = BatchMaker(cfg, tokenizer, self.rewards, self.shard, self.weights, policy)
        self.engine: SlotEngine | None = None
        self.pacing = pacing_for(cfg)
        self.generation = GenerationLoop(cfg, self.shard, self.batches, self.weights, self.pacing)
        self.generation.seq = self.next_seq
        self.pacing.resume(self.generation, self.spool.dir)
        e = cfg.eval
        answers = eval_engine(cfg) == "sampler" and e.interval and e.num_questions
        self.evaluation = SamplerEvaluation(cfg, task, tokenizer) if answers else None

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        cfg = self.cfg
        if self.next_seq >= cfg.train.total_steps and not self.spool.pending():
            log.info("this sampler made all %d batches of the run: nothing left", self.next_seq)
            return 0
        endpoint = SamplerEndpoint(
            cfg.transport,
            cfg.rollout.sampler_id,
            self.spool,
            exit_on_stall=True,
        )
        self.rewards.stop_on(endpoint.stopped)
        self.engine = engine = self.make_engine(endpoint.stopped)
        link = endpoint.weights_link(cfg.run_dir, self.weights.seed())
        endpoint.carry(self.weights.connect(link, endpoint, engine))
        signalled = _stop_on_signals(endpoint)
        failed = ""
        try:
            self.loop(engine, endpoint)
        except PeerError as e:  # also a generation cut short because the run is done
            failed = str(e)
        except BaseException as e:
            endpoint.stop(stop_reason(e))
            endpoint.close()
            raise
        if endpoint.status.done:
            endpoint.finish()
            self.pacing.finish(self.spool.dir)
            log.info("sampler done: batches 0 to %d sent", self.next_seq - 1)
            endpoint.close()
            return 0
        reason = endpoint.status.stop_reason or failed or "stopped"
        endpoint.stop(reason)
        endpoint.close()
        log.error("sampler stopping: %s", reason)
        return 130 if signalled.is_set() else 1

    def make_engine(self, stop_event: threading.Event) -> SlotEngine:
        """The engine rollout.backend names, built from the sampler's parts."""
        context = EngineContext(
            self.cfg,
            self.policy.model_path,
            self.tokenizer,
            stop_event,
            policy=self.policy,
        )
        return build_engine(context)

    def expected_batch(self, status: TrainerStatus) -> int:
        """The run's batch number the next batch of this sampler is expected to be."""
        sid = self.cfg.rollout.sampler_id
        return expected_batch(status.trained, sid, self.next_seq, status.alive)

    def loop(self, engine: SlotEngine, endpoint: SamplerEndpoint) -> None:
        """Batches while the run needs more, then wait for the trainer's done. The samplers are
        a pool: none has a quota, each makes the batches the trainer is expected to train next
        (see expected_batch), so when one dies the others make its share."""
        cfg, status, total = self.cfg, endpoint.status, self.cfg.train.total_steps
        endpoint.wait_for_trainer()
        if self.evaluation is not None:  # answered in any wait from now on, between batches
            # Not before: a batch vouches for this sampler first (answers never do), or a long
            # first evaluation would run out the trainer's transport.startup_timeout_s.
            whole, evaluation = whole_batch_engine(engine), self.evaluation
            endpoint.on_wait = lambda: evaluation.answer_if_asked(endpoint, self.weights, whole)
        # launch.sh turns it off (TQDM_DISABLE=1) when the trainer's bar shares the terminal.
        alone = cfg.rollout.num_samplers == 1
        bar = terminal_bar(total=total if alone else None, initial=self.next_seq, desc="sample")

        run = SamplerRun(self, endpoint, bar)
        # Bounded waits: the endpoint sets `stopped` on done, stop, or a lost trainer.
        while not endpoint.stopped.is_set():
            if self.expected_batch(status) >= total:  # enough on the way: wait (and see)
                endpoint.wait_until(lambda: self.expected_batch(status) < total, "the run's end")
                continue
            self.generation.run(engine, run, self.next_seq)
        bar.close()


class SamplerRun:
    """The run as the generation loop asks of it (grpo.sampler.generation.RunView): this
    sampler's share of it, from the trainer's last word, and its endpoint."""

    def __init__(self, sampler: Sampler, endpoint: SamplerEndpoint, bar):
        self.sampler, self.endpoint, self.bar = sampler, endpoint, bar
        self.status = endpoint.status

    def next_batch(self) -> tuple[int, int]:
        return self.sampler.expected_batch(self.status), self.status.alive

    def groups_wanted(self) -> int:
        cfg = self.sampler.cfg
        left = cfg.train.total_steps - self.sampler.expected_batch(self.status)
        return max(left, 0) * cfg.rollout.questions_per_step

    def wait_for_room(self) -> None:
        self.endpoint.wait_for_room()

    def stopped(self) -> bool:
        return self.endpoint.stopped.is_set()

    def send(self, batch: EpisodeBatch) -> None:
        """Spool and send; a resume's state goes first, so a resume finds the one that goes
        with the last batch spooled."""
        sampler, endpoint = self.sampler, self.endpoint
        endpoint.wait_for_room()
        if endpoint.stopped.is_set():
            raise PeerError("stopped")
        sampler.pacing.save(sampler.generation, sampler.spool.dir)
        sampler.next_seq = batch.seq + 1
        endpoint.send(batch, sampler.shard.state(sampler.next_seq))
        log.info(
            "sent batch %d (version %d): reward %.3f, %.0f tokens/s",
            batch.seq,
            batch.policy_version,
            mean([e.reward for e in batch.episodes]),
            batch.stats["gen_tokens_per_s"],
        )
        tokens_per_s = f"{batch.stats['gen_tokens_per_s']:.0f}"
        self.bar.set_postfix(version=batch.policy_version, tokens_per_s=tokens_per_s)
        self.bar.update()


def stop_reason(error: BaseException) -> str:
    """What a sampler's stop tells the trainer of the error that ended it: its reward failing
    is the run's input (no restart scores differently, grpo.wire.messages.INPUT_STOPPED),
    anything else a crash."""
    if isinstance(error, RewardFailingError):
        return f"{messages.INPUT_STOPPED}: {error}"
    return f"crashed: {type(error).__name__}: {error}"


def _stop_on_signals(endpoint: SamplerEndpoint) -> threading.Event:
    """Ctrl-C / SIGTERM end generation at the next token and the run cleanly; returns the flag."""
    signalled = threading.Event()

    def handler(signum, frame):
        signalled.set()
        endpoint.interrupt(f"{messages.INTERRUPTED} by {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return signalled


def run_sampler(cfg: Config) -> int:
    sampler = Sampler(cfg)
    try:
        return sampler.run()
    finally:
        sampler.rewards.close()  # kills the reward workers, a stuck one included
        if sampler.engine is not None:
            sampler.engine.close()
