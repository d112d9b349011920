"""The training loop: next batch, one step (grpo.trainer.step: any policy loss, GRPO, GSPO, PPO
with a critic...), publish and save as due, the metrics row.

Rank 0 receives through its delivery endpoint (grpo.delivery.trainer_endpoint); it broadcasts
each batch as one encoded blob (the same pickle-free frames that crossed the wire) so every rank
decodes exactly what rank 0 received; the other ranks' endpoint and run log do nothing.
Weights after step s are version s; every `train.sync_interval` steps rank 0 publishes them (under
ZeRO-3 every rank takes part in gathering them first: grpo.weights.publisher).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.config.rules import eval_engine
from grpo.core.durable import train_state_dir
from grpo.core.episode import EpisodeBatch
from grpo.delivery.admission import Expected
from grpo.delivery.ledger import Ledger
from grpo.delivery.trainer_endpoint import Endpoint, ModeLink, SilentEndpoint, TrainerEndpoint
from grpo.eval.in_training import VersionEvaluator
from grpo.models.loading import load_tokenizer, resolve_model_path
from grpo.observe.metrics import peak_memory_gib
from grpo.observe.run_log import RunLog, SilentRunLog
from grpo.plan import plan_run
from grpo.runtime.lifetime import restarts, restarts_left
from grpo.runtime.progress import (
    ACTIVITY,
    EVALUATING,
    PUBLISHING,
    SAVING,
    WAITING,
    Stopwatch,
)
from grpo.trainer import state as train_state
from grpo.trainer.critic import Critic
from grpo.trainer.engines import deepspeed_config, policy_engine, reference_model
from grpo.trainer.outputs import open_run_dir, step_row, summarise_run
from grpo.trainer.ranks import (
    GO_ON,
    KEEPALIVE,
    broadcast_batch,
    broadcast_size,
    collective_failure,
    collective_timeout_s,
    gather_group_ids,
    max_across_ranks,
    wait_for_rank0,
)
from grpo.trainer.step import Models, RankGroups, StepResult, train_step
from grpo.weights.publisher import Publisher, keep_initial, publishes_here, weights_to_publish
from grpo.wire import messages
from grpo.wire.channels import PeerError

log = logging.getLogger("grpo.trainer")


def open_endpoint(
    cfg: Config, ledger: Ledger, expected: Expected, version: int, publisher: Publisher
) -> TrainerEndpoint:
    """Rank 0's delivery endpoint, and beside it the weights mode's trainer end, which learns
    of the samplers from the endpoint's pool and stops the run through its channel. A resumed
    trainer announces its own version and acknowledgements from its very first heartbeat."""
    endpoint = TrainerEndpoint(
        cfg.transport,
        ledger,
        expected,
        version,
        max_held=cfg.rollout.spool_max_batches,
        exit_on_stall=True,
        announced=publisher.announced,
    )
    publisher.start(ModeLink(endpoint, version))
    return endpoint


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.plan = plan_run(cfg, self.world)
        self.shard = RankGroups(self.rank, cfg.rollout.questions_per_step // self.world)
        torch.manual_seed(cfg.train.seed)
        self.model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id
        policy, vocab_size = policy_engine(cfg, self.model_path, self.world)
        self.expected = Expected.for_run(cfg, self.plan.scored_by_sampler, vocab_size)
        ds_config = deepspeed_config(cfg, self.world, self.plan.update.mini_batch_seqs)
        # train.logprobs_on: trainer: the old and reference log-probs the run needs
        # (grpo.config.passes) are computed here.
        scored_here = self.plan.scored_by_trainer
        self.models = Models(
            policy=policy,
            reference=reference_model(cfg, self.model_path, ds_config, policy.device)
            if "ref_logp" in scored_here
            else None,
            critic=Critic(cfg, ds_config)
            if self.plan.experience.advantage.estimator.needs_critic
            else None,
            scored_here=scored_here,
        )
        self.run_dir = cfg.run_dir
        self.evaluator = VersionEvaluator(cfg, self.tokenizer, self.rank, self.world)
        self.run_log: RunLog | SilentRunLog = SilentRunLog()  # rank 0's writes, once open
        # Rank 0's talks to the samplers once run() opens it; the other ranks' never does.
        self.endpoint: Endpoint = SilentEndpoint()
        self.version = 0
        # weights.mode: stream: the versions rank 0 serves from memory.
        self.publisher = Publisher(cfg, self.tokenizer) if self.rank == 0 else None
        self.kl_reward_coef = cfg.algo.kl_reward_coef  # adapted each step with kl_ctrl adaptive
        self.ledger = Ledger()  # every rank keeps it: it is part of the saved state
        self.start_step = 0
        if cfg.train.resume != "never":
            self.resume()

    # ------------------------------------------------------------------ durable state

    def state_fingerprint(self) -> dict[str, Any]:
        return train_state.fingerprint(self.cfg, self.world, self.models.critic is not None)

    def resume(self) -> None:
        state_dir = train_state_dir(self.run_dir)
        resumed = train_state.load(state_dir, self.models.engines(), self.state_fingerprint())
        if resumed is None:
            if self.cfg.train.resume == "always":
                raise ValueError(f"--resume: no complete training state in {state_dir}")
            return
        self.start_step, self.version = resumed.step, resumed.version
        self.kl_reward_coef, self.ledger = resumed.kl_reward_coef, resumed.ledger
        if self.publisher is not None:
            self.publisher.restore(resumed.where)
        if self.rank == 0:
            log.info(
                "resumed from %s at step %d (%d batches in its ledger)",
                state_dir,
                self.start_step,
                sum(len(s) for s in self.ledger.durable.values()),
            )

    def save_state(self, step: int) -> None:
        """All ranks: the training state of `step` on disk, then its batches acknowledged."""
        client_state = {
            "step": step,
            "version": self.version,
            "kl_reward_coef": self.kl_reward_coef,
            "ledger": self.ledger.consumed_json(),
        }
        state_dir = train_state_dir(self.run_dir)
        engines, fingerprint = self.models.engines(), self.state_fingerprint()
        keep = self.publisher.keep_for_resume(step) if self.publisher is not None else None
        train_state.save(state_dir, step, engines, client_state, fingerprint, keep)
        self.ledger.mark_durable()
        self.endpoint.saved()

    def publish(self, step: int) -> None:
        """Rank 0 publishes version `step` (full weights or the LoRA adapter) and announces it;
        under ZeRO-3 every rank comes here, to gather the parameters (grpo.weights.publisher)."""
        with weights_to_publish(self.models.policy, self.cfg.model.lora.enabled) as weights:
            if self.publisher is not None:
                self.publisher.publish(weights, step)
        self.version = step
        self.endpoint.published(step)

    def receive(self) -> EpisodeBatch | None:
        """Rank 0 waits for the next batch, keeping the other ranks' broadcast alive meanwhile;
        if that fails, the other ranks are told to stop. The other ranks return at once."""
        ACTIVITY.enter(WAITING, "for a batch")
        try:
            return self.endpoint.next_batch(keepalive=lambda: broadcast_size(KEEPALIVE))
        except BaseException:
            broadcast_batch(None, 0, self.cfg.transport.max_frame_bytes)
            raise

    def step(self, step: int, batch: EpisodeBatch, seconds: Stopwatch) -> dict[str, Any]:
        """Train on `batch` (every rank), publish and save as due; the step's metrics row.
        `seconds` holds the time spent receiving it and gets the rest of the step's parts."""
        cfg = self.cfg
        result = train_step(
            self.models,
            batch,
            self.plan,
            step,
            self.kl_reward_coef,
            self.shard,
            self.pad_id,
            seconds,
        )
        self.kl_reward_coef = result.kl_reward_coef
        for engine, n in result.skipped.items():
            if n:  # DeepSpeed found non-finite gradients (bf16 overflow) and did not step
                log.warning(
                    "step %d: %d %s optimizer step(s) skipped: non-finite gradients",
                    step,
                    n,
                    engine,
                )
        self.ledger.consume(batch.sampler_id, batch.seq)
        self.endpoint.consumed()
        last = step == cfg.train.total_steps
        with seconds("publish_s"):
            if step % cfg.train.sync_interval == 0 or last:
                self.publish_if_here(step)
        with seconds("state_s"):
            if cfg.train.state_interval and step % cfg.train.state_interval == 0 and not last:
                with ACTIVITY.during(SAVING, f"state of step {step}"):
                    self.save_state(step)
        return self.metrics_row(step, result, seconds)

    def publish_if_here(self, step: int) -> None:
        if publishes_here(self.models.policy, self.rank):
            with ACTIVITY.during(PUBLISHING, f"version {step}"):
                self.publish(step)

    def metrics_row(self, step: int, result: StepResult, seconds: Stopwatch) -> dict[str, Any]:
        """Every rank takes part (two collectives); rank 0 logs the row."""
        groups = gather_group_ids(result.batch.select_groups(*self.shard.group_span))
        peak_mem = float(max_across_ranks(torch.tensor([peak_memory_gib()])))
        return step_row(
            step,
            result.batch,
            self.cfg,
            self.world,
            counters={
                "published_version": self.version,
                "trainer_restarts": restarts(),  # by launch.sh, so far
                **self.endpoint.counters(),
                **{f"{engine}_steps_skipped": n for engine, n in result.skipped.items()},
            },
            numbers=result.numbers,
            seconds=seconds,
            peak_mem_gib=peak_mem,
            rank_group_ids=groups,
        )

    def evaluate(self, step: int) -> None:
        """Every rank: evaluate the weights after `step` (version `step`) when it is due."""
        if not self.evaluator.due(step, last=step == self.cfg.train.total_steps):
            return
        if eval_engine(self.cfg) == "sampler":
            row = scored_answers(self, step)
        else:
            with ACTIVITY.during(EVALUATING, f"version {step}"):
                row = self.evaluator.evaluate(self.models.policy.module, step)
        if row is not None:
            self.run_log.eval(row)

    def run(self) -> None:
        cfg = self.cfg
        if (publisher := self.publisher) is not None:  # rank 0
            # First: a busy port moves nothing.
            self.endpoint = open_endpoint(cfg, self.ledger, self.expected, self.version, publisher)
            open_run_dir(cfg, self.start_step)
            self.run_log = RunLog(cfg, self.start_step, self.tokenizer)
            log.info(
                "trainer: %d rank(s), listening on %s", self.world, cfg.transport.episodes_addr
            )
        if self.start_step:
            self.publish_if_here(self.start_step)  # the samplers follow back to these weights
        elif publishes_here(self.models.policy, self.rank):
            store = self.publisher.store if self.publisher else None
            keep_initial(self.models.policy, cfg, store)  # the first delta's base
        try:
            if self.start_step == 0:
                self.evaluate(0)  # the initial weights, while the samplers make batch 0
            for step in range(self.start_step + 1, cfg.train.total_steps + 1):
                seconds = Stopwatch()
                with seconds("recv_s"):
                    batch = self.receive()
                batch = broadcast_batch(batch, self.rank, cfg.transport.max_frame_bytes)
                if batch is None:
                    raise PeerError("rank 0 ended the run")
                self.run_log.step(self.step(step, batch, seconds), batch)
                self.evaluate(step)  # version `step` is out: the samplers go on meanwhile
            if self.start_step < cfg.train.total_steps:
                self.save_state(cfg.train.total_steps)
            self.endpoint.finish()
        except BaseException as e:
            failure = collective_failure(e, self.rank, collective_timeout_s(cfg.transport))
            interrupted = isinstance(e, KeyboardInterrupt)
            # A failure launch.sh heals is no stop: the samplers wait for the restarted trainer.
            if interrupted or not restarts_left():
                self.endpoint.stop(messages.INTERRUPTED if interrupted else failure or str(e))
            raise
        finally:
            if self.publisher is not None:
                self.publisher.close()
            self.endpoint.close()
            self.run_log.close()
        if self.rank == 0:
            summarise_run(self.run_dir, cfg.train.total_steps, self.version)


def scored_answers(trainer: Trainer, version: int) -> dict | None:
    """Every rank, eval.engine: sampler: rank 0 returns the row of the sampler's answers for
    `version`, scored there; the other ranks wait for it, kept alive meanwhile (and told to
    stop if it fails), as they would not otherwise after the last step (they save the state)."""
    if trainer.rank != 0:
        wait_for_rank0()
        return None
    t0 = time.monotonic()
    ACTIVITY.enter(WAITING, f"for version {version}'s evaluation answers")
    try:
        keepalive = lambda: broadcast_size(KEEPALIVE)  # noqa: E731
        data = trainer.endpoint.evaluation(version, keepalive)
        with ACTIVITY.during(EVALUATING, f"version {version}"):
            try:
                seconds, vocab = time.monotonic() - t0, trainer.expected.vocab_size
                row = trainer.evaluator.row_from_sampler(data, version, seconds, vocab)
            except ValueError as e:
                raise PeerError(
                    f"the sampler's answers to the evaluation of version {version} are not "
                    f"answers to this trainer's questions ({e}): do both roles run the same "
                    "config?"
                ) from None
    except BaseException:
        broadcast_batch(None, 0, trainer.cfg.transport.max_frame_bytes)
        raise
    broadcast_size(GO_ON)
    return row
