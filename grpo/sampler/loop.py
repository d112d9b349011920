"""The sampling loop: questions -> G answers -> rewards, log-probs -> EpisodeBatch -> trainer.

Versions: the sampler starts on version 0 (the initial weights). The trainer announces each
version it publishes in its heartbeats; before batch `seq` the sampler waits until a version
>= seq - max_staleness is out, reloads it from the run dir, and tags the batch with it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo.config import Config
from grpo.core.episode import Episode, EpisodeBatch
from grpo.delivery.ledger import overtaken
from grpo.delivery.spool import Spool
from grpo.delivery.versions import (
    is_adapter,
    load_state_dict,
    require_same,
    verify_version,
    version_dir,
)
from grpo.logprobs import Truncation, score_for_training
from grpo.metrics import EVAL_FILE, append_jsonl, info_rates, mean, peak_memory_gib, plot_run
from grpo.models import (
    apply_lora,
    load_causal_lm,
    load_reference,
    load_tokenizer,
    resolve_model_path,
)
from grpo.placement import sampler_memory_fraction
from grpo.rollout.base import EngineContext, Generation, RolloutEngine
from grpo.rollout.registry import get_engine
from grpo.tasks import Row, Task, get_task, load_reward_fn, score
from grpo.wire import messages
from grpo.wire.channels import PeerError, SamplerChannel
from grpo.wire.codec import encode_batch

log = logging.getLogger("grpo.sampler")

Rollout = RolloutEngine


@dataclass(frozen=True)
class Prompt:
    index: int  # row index in the dataset: the group id
    row: Row
    ids: np.ndarray  # int32 chat-templated prompt tokens


def encode_prompts(
    task: Task, rows: list[Row], tokenizer, system_prompt: str, max_tokens: int
) -> list[Prompt]:
    """Chat-template every row; rows whose prompt exceeds `max_tokens` are skipped (logged)."""
    prompts = []
    for i, row in enumerate(rows):
        text = tokenizer.apply_chat_template(
            task.build_messages(row, system_prompt), add_generation_prompt=True, tokenize=False
        )
        ids = np.asarray(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int32)
        if len(ids) <= max_tokens:
            prompts.append(Prompt(i, row, ids))
    if len(prompts) < len(rows):
        log.warning(
            "skipped %d prompts longer than %d tokens", len(rows) - len(prompts), max_tokens
        )
    if not prompts:
        raise ValueError(f"no prompt fits data.max_prompt_tokens={max_tokens}")
    return prompts


def question_stream(
    prompts: list[Prompt], n: int, seed: int, shuffle: bool, start: int = 0
) -> Iterator[list[Prompt]]:
    """Endless batches of `n` prompts; each epoch is a fresh seeded permutation. The first
    `start` prompts are skipped: a resumed sampler goes on where it stopped."""

    def order_of(epoch: int) -> np.ndarray:
        rng = np.random.default_rng(seed + epoch)
        return rng.permutation(len(prompts)) if shuffle else np.arange(len(prompts))

    epoch, pos = divmod(start, len(prompts))
    order = order_of(epoch)
    while True:
        batch = []
        while len(batch) < n:
            if pos == len(order):
                epoch, pos = epoch + 1, 0
                order = order_of(epoch)
            batch.append(prompts[order[pos]])
            pos += 1
        yield batch


def required_version(seq: int, max_staleness: int, sync_interval: int) -> int:
    """The oldest weights batch `seq` may be sampled with.

    Batch k is trained at step k + 1, so with no lag it needs version k; `max_staleness` allows
    that many versions of lag, and only multiples of `sync_interval` are ever published.
    """
    return max(0, (seq - max_staleness) // sync_interval * sync_interval)


@dataclass(frozen=True, eq=False)
class Group:
    """One question's G answers with their (reward, info)."""

    prompt: Prompt
    gens: list[Generation]
    scored: list[tuple[float, dict]]

    def is_flat(self) -> bool:
        return len({reward for reward, _ in self.scored}) == 1


class Sampler:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.task = get_task(cfg.data.task)
        self.reward_fn = load_reward_fn(cfg.data.reward) if cfg.data.reward else self.task.reward
        model_path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(model_path)
        train_rows = self.task.load(cfg.data.train or self.task.default_train)
        r = cfg.rollout
        prompts = encode_prompts(
            self.task,
            train_rows,
            self.tokenizer,
            cfg.data.system_prompt,
            cfg.data.max_prompt_tokens,
        )
        # Disjoint shards by row index (rows i, i + n, ...), whatever prompts were skipped.
        self.prompts = [p for p in prompts if p.index % r.num_samplers == r.sampler_index]
        if not self.prompts:
            raise ValueError(f"sampler {r.sampler_index} of {r.num_samplers} has no train rows")
        self.spool = Spool(cfg.spool_path, r.spool_max_batches)
        self.next_seq, self.position = self.resume_position()
        self.eval_prompts: list[Prompt] = []
        if cfg.eval.interval and cfg.eval.num_questions:
            test_rows = self.task.load(cfg.data.test or self.task.default_test)
            self.eval_prompts = encode_prompts(
                self.task,
                test_rows[: cfg.eval.num_questions],
                self.tokenizer,
                cfg.data.system_prompt,
                cfg.data.max_prompt_tokens,
            )
        self.model_path = model_path
        self.device = device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and (cap := sampler_memory_fraction(cfg)):
            # Sharing the GPU with the trainer: past the cap our allocations fail here,
            # with a message, instead of the trainer running out of memory mid-step.
            torch.cuda.set_per_process_memory_fraction(cap)
            log.info("sampler: HF models capped at %.0f%% of the GPU's memory", 100 * cap)
        # HF models only where they are used: to score the answers (train.logprobs_on:
        # sampler) and for an engine that samples with the policy (hf_policy, on demand).
        # vLLM with trainer-side scoring needs neither.
        self.scores = cfg.train.logprobs_on == "sampler"
        self.policy = self.reference = None
        if self.scores:
            self.hf_policy()
            self.reference = load_reference(
                model_path, cfg.model.dtype, cfg.model.attn_implementation
            ).to(device)
        self.rollout: Rollout | None = None
        self.reload_s = 0.0
        self.version = 0
        self.reloaded: list[int] = []
        self.evaluated: set[int] = set()
        self.channel: SamplerChannel | None = None
        self.signalled = threading.Event()
        self.restarts_handled = 0
        self.resent_at: dict[int, float] = {}  # seq -> when last resent
        self.failed_reloads: set[int] = set()  # versions whose files failed their checksums

    def hf_policy(self) -> torch.nn.Module:
        """The HF policy (loaded on first use), which the sampler keeps at its version."""
        if self.policy is None:
            cfg = self.cfg
            attn = cfg.model.attn_implementation
            policy = load_causal_lm(self.model_path, cfg.model.dtype, attn).eval()
            if cfg.model.lora.enabled:
                policy = apply_lora(policy, cfg.model.lora).eval()
            self.policy = policy.to(self.device)
        return self.policy

    # ------------------------------------------------------------------ resume

    def data_fingerprint(self) -> dict[str, Any]:
        """What must not change for a dataset position to mean the same questions."""
        cfg = self.cfg
        return {
            "task": cfg.data.task,
            "train": cfg.data.train,
            "prompts": len(self.prompts),
            "first_row": self.prompts[0].index,
            "seed": cfg.rollout.seed,
            "shuffle": cfg.data.shuffle,
            "questions_per_step": cfg.rollout.questions_per_step,
            "num_samplers": cfg.rollout.num_samplers,
            "sampler_index": cfg.rollout.sampler_index,
        }

    def resume_position(self) -> tuple[int, int]:
        """(next batch seq, prompts drawn so far): from the spool with train.resume, else zero
        (and the spool of an earlier run is emptied)."""
        where = self.spool.dir
        if self.cfg.train.resume == "never":
            self.spool.clear()
            return 0, 0
        state = self.spool.read_state()
        if state is None:
            if self.cfg.train.resume == "always":
                raise ValueError(f"--resume: no sampler state in {where} (rollout.spool_dir)")
            return 0, 0
        require_same(
            state["fingerprint"],
            self.data_fingerprint(),
            f"the sampler from {where}",
            "use the same data and rollout settings, or train.resume=never for a new run",
        )
        next_seq, position = state["next_seq"], state["position"]
        pending = self.spool.pending()
        if pending and pending[-1] >= next_seq:  # killed between spooling a batch and the state
            last = self.spool.batch(pending[-1])
            next_seq, position = last.seq + 1, int(last.stats["data_end"])
        log.info(
            "resuming at batch %d, question %d of the shard (%d batches spooled)",
            next_seq,
            position,
            len(pending),
        )
        return next_seq, position

    # ------------------------------------------------------------------ weights

    def reload(self, version: int) -> None:
        """Load published version `version` into the HF policy and the vLLM engine (if any).

        A version whose files fail their checksums (or are gone) is not loaded: the sampler
        keeps its current weights, says why, and tries again at the next announced version."""
        vdir = version_dir(self.run_dir, version)
        try:
            if self.channel is not None and self.channel.weights is not None:
                self.channel.weights.fetch(self.run_dir, version, self.cfg.train.keep_versions)
            verify_version(vdir)
        except ValueError as e:
            self.failed_reloads.add(version)
            log.warning("keeping version %d, not loading version %d: %s", self.version, version, e)
            return
        t0 = time.monotonic()
        if self.policy is not None:
            self.load_into_policy(vdir)
        if self.rollout is not None:
            self.rollout.load_version(vdir, version)
        self.reload_s = time.monotonic() - t0
        log.info(
            "reloaded weights: version %d -> %d in %.1f s", self.version, version, self.reload_s
        )
        self.version = version
        self.reloaded.append(version)

    def load_into_policy(self, vdir: Path) -> None:
        assert self.policy is not None
        state = load_state_dict(vdir)
        if is_adapter(vdir):
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.policy, state)
            if result.unexpected_keys:
                raise RuntimeError(
                    f"{vdir} holds adapter weights this sampler's LoRA does not have "
                    f"({result.unexpected_keys[:3]}...): use the same model.lora on both roles"
                )
        else:
            missing, unexpected = self.policy.load_state_dict(state, strict=False)
            tied = set(getattr(self.policy, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
            if unexpected or set(missing) - tied:
                raise RuntimeError(
                    f"{vdir} does not match the policy: missing {missing}, unexpected {unexpected}"
                )

    def wait_for_version(self, needed: int) -> None:
        """Wait until the trainer published `needed` (the staleness bound), then load the newest
        (after a trainer restart that may be older than the one this sampler had)."""
        assert self.channel is not None
        status = self.channel.status
        self.wait_until(lambda: status.version >= needed, f"version {needed}")
        newest = status.version
        if (
            newest != self.version
            and newest not in self.failed_reloads
            and not self.channel.stopped.is_set()
        ):
            self.reload(newest)

    def wait_until(self, ready: Callable[[], bool], what: str) -> None:
        """Sleep until `ready()` or the trainer stops us, keeping the spool in step meanwhile."""
        assert self.channel is not None
        last_note = time.monotonic()
        while True:
            self.sync_with_trainer()
            if ready() or self.channel.stopped.is_set():
                return
            self.channel.wait_for_news(timeout_s=5.0)
            if time.monotonic() - last_note > 60:
                version = self.channel.status.version
                log.info("waiting for %s (trainer at version %d)", what, version)
                last_note = time.monotonic()

    # ------------------------------------------------------------------ delivery

    def sync_with_trainer(self) -> None:
        """Drop acknowledged batches from the spool; resend the rest after a trainer restart,
        and any batch the trainer passed over (lost on the way)."""
        assert self.channel is not None
        status = self.channel.status
        self.spool.acknowledge(status.acked)
        if status.restarts != self.restarts_handled:
            self.restarts_handled = status.restarts
            self.resend(self.spool.pending())
            return
        # A resend needs a few heartbeats to show up as consumed: do not repeat it before.
        patience = 10 * self.cfg.transport.heartbeat_s
        now = time.monotonic()
        lost = [s for s in overtaken(self.spool.pending(), status.consumed)
                if now - self.resent_at.get(s, 0.0) > patience]  # fmt: skip
        if lost:
            log.warning("the trainer passed over batches %s (lost on the way): resending", lost)
            self.resend(lost)

    def resend(self, seqs: list[int]) -> None:
        assert self.channel is not None
        for seq in seqs:
            self.channel.send_frames(self.spool.frames(seq), seq)
            self.resent_at[seq] = time.monotonic()
        if seqs:
            log.info("resent %d unacknowledged batches: %s", len(seqs), seqs)

    def send_new(self, batch: EpisodeBatch) -> None:
        """Spool, then record the position, then send: a crash anywhere loses nothing."""
        assert self.channel is not None
        frames = encode_batch(batch)
        self.channel.check_size(frames, batch.seq)
        self.spool.put(batch.seq, frames)
        self.next_seq = batch.seq + 1
        self.spool.write_state(
            {
                "next_seq": self.next_seq,
                "position": self.position,
                "fingerprint": self.data_fingerprint(),
            }
        )
        self.channel.send_frames(frames, batch.seq)

    # ------------------------------------------------------------------ batches

    def sample_groups(self, prompts: list[Prompt], rollout: Rollout, seed: int) -> list[Group]:
        """G answers per prompt, decoded and scored."""
        cfg, G = self.cfg.rollout, self.cfg.rollout.group_size
        gens = rollout.generate(
            [p.ids for p in prompts],
            n=G,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=cfg.stop,
            seed=seed,
            batch_size=cfg.generation_batch_size,
        )
        self.raise_if_stopped(rollout)
        texts = self.tokenizer.batch_decode(
            [g.completion_ids for g in gens], skip_special_tokens=True
        )
        groups = []
        for k, prompt in enumerate(prompts):
            members = range(k * G, (k + 1) * G)
            scored = [score(self.reward_fn, texts[i], prompt.row) for i in members]
            groups.append(Group(prompt, [gens[i] for i in members], scored))
        return groups

    def make_batch(
        self, seq: int, stream: Iterator[list[Prompt]], rollout: Rollout
    ) -> EpisodeBatch:
        cfg, Q = self.cfg.rollout, self.cfg.rollout.questions_per_step
        t0, data_start = time.monotonic(), self.position
        kept, flat, rounds, n_tokens = [], [], 0, 0
        # DAPO's dynamic sampling: a group whose answers all score the same has zero advantage
        # and teaches nothing; sample more questions instead, up to max_sampling_rounds.
        while len(kept) < Q and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            prompts = next(stream)
            self.position += len(prompts)
            groups = self.sample_groups(prompts, rollout, cfg.seed + seq + rounds * 1_000_003)
            rounds += 1
            n_tokens += sum(len(g.completion_ids) for group in groups for g in group.gens)
            for g in groups:
                (flat if cfg.dynamic_sampling and g.is_flat() else kept).append(g)
        chosen = (kept + flat)[:Q]  # past the cap, flat groups fill the batch (zero advantage)
        t1 = time.monotonic()
        episodes = self.attach_logprobs(chosen)
        t2 = time.monotonic()
        stats = {
            "gen_s": t1 - t0,
            "logprob_s": t2 - t1,
            "gen_tokens": float(n_tokens),
            "gen_tokens_per_s": n_tokens / max(t1 - t0, 1e-9),
            "reload_s": self.reload_s,
            "sampling_rounds": float(rounds),
            "groups_generated": float(len(kept) + len(flat)),
            "flat_groups_dropped": float(len(flat) - sum(g in chosen for g in flat)),
            "flat_groups_kept": float(sum(g in chosen for g in flat)),
            # Which prompts of this sampler's shard the batch drew: [data_start, data_end).
            "data_start": float(data_start),
            "data_end": float(self.position),
            "peak_mem_gib": peak_memory_gib(),
        }
        return EpisodeBatch(episodes, cfg.group_size, self.version, seq, cfg.sampler_id, stats)

    def attach_logprobs(self, groups: list[Group]) -> tuple[Episode, ...]:
        """Every answer as an episode, with its old-policy and reference log-probs when the
        sampler computes them (train.logprobs_on: sampler), else without."""
        gens = [g for group in groups for g in group.gens]
        scored = [s for group in groups for s in group.scored]
        index = [group.prompt.index for group in groups for _ in group.gens]
        old, ref, rollout = self.score(gens)
        return tuple(
            Episode(g.prompt_ids, g.completion_ids, o, r, reward, info, g.finish_reason, i, lp)
            for g, o, r, lp, (reward, info), i in zip(
                gens, old, ref, rollout, scored, index, strict=True
            )
        )

    def score(self, gens: list[Generation]) -> tuple[list, list, list]:
        """(old, reference, rollout) log-probs per answer; None where not computed here
        (see grpo.logprobs.score_for_training)."""
        rollout = [g.rollout_logp for g in gens]
        if not self.scores:
            return [None] * len(gens), [None] * len(gens), rollout
        cfg = self.cfg.rollout
        return score_for_training(
            self.policy,
            self.reference,
            [g.prompt_ids for g in gens],
            [g.completion_ids for g in gens],
            rollout,
            truncation=Truncation(cfg.top_p, cfg.top_k),
            pad_id=self.tokenizer.pad_token_id,
            temperature=cfg.temperature,
            batch_size=cfg.generation_batch_size,
            packed=self.cfg.packed,
        )

    # ------------------------------------------------------------------ eval

    def raise_if_stopped(self, rollout: Rollout) -> None:
        """generate() returns early when told to stop; its partial output must not be used."""
        if rollout.stop_event.is_set():
            assert self.channel is not None
            raise PeerError(self.channel.status.stop_reason or "stopped during generation")

    def evaluate(self, rollout: Rollout) -> None:
        """Greedy pass@1 on the first eval.num_questions test questions; one row in eval.jsonl."""
        if not self.eval_prompts or self.version in self.evaluated:
            return
        t0 = time.monotonic()
        gens = rollout.generate(
            [p.ids for p in self.eval_prompts],
            n=1,
            greedy=True,
            max_new_tokens=self.cfg.eval.max_new_tokens,
            batch_size=self.cfg.rollout.generation_batch_size,
        )
        self.raise_if_stopped(rollout)
        texts = self.tokenizer.batch_decode(
            [g.completion_ids for g in gens], skip_special_tokens=True
        )
        pairs = zip(texts, self.eval_prompts, strict=True)
        infos = [score(self.reward_fn, t, p.row)[1] for t, p in pairs]
        row = {
            "version": self.version,
            **info_rates(infos),
            "n": len(infos),
            "seconds": round(time.monotonic() - t0, 2),
        }
        append_jsonl(self.run_dir / EVAL_FILE, row)
        self.evaluated.add(self.version)
        log.info(
            "eval v%d: accuracy %.3f, format %.3f on %d questions (%.0f s)",
            self.version,
            row["accuracy"],
            row["format_rate"],
            row["n"],
            row["seconds"],
        )

    def eval_due(self) -> bool:
        return bool(self.cfg.eval.interval) and self.version % self.cfg.eval.interval == 0

    # ------------------------------------------------------------------ loop

    @property
    def share(self) -> int:
        """How many batches this sampler makes in the whole run."""
        return self.cfg.train.total_steps // self.cfg.rollout.num_samplers

    def run(self) -> int:
        cfg = self.cfg
        if self.next_seq >= self.share and not self.spool.pending():
            log.info("all %d batches of this sampler were trained on: nothing left", self.share)
            return 0
        self.channel = channel = SamplerChannel(cfg.transport, cfg.rollout.sampler_id)
        self.rollout = rollout = self.make_rollout(channel.stopped)
        self.signalled = signalled = _stop_on_signals(channel)
        try:
            self.loop(rollout)
            if channel.status.done:
                self.finish(rollout)
                channel.send_bye()
                channel.close()
                return 0
            reason = channel.status.stop_reason or "stopped"
        except PeerError as e:
            reason = channel.status.stop_reason or str(e)
        except BaseException as e:
            channel.send_stop(f"sampler {cfg.rollout.sampler_id} crashed: {type(e).__name__}: {e}")
            channel.close()
            raise
        # Tell the trainer why, unless it is the one that went away.
        if not reason.startswith((messages.TRAINER_STOPPED, messages.TRAINER_SILENT)):
            channel.send_stop(f"sampler {cfg.rollout.sampler_id}: {reason}")
        channel.close()
        log.error("sampler stopping: %s", reason)
        return 130 if signalled.is_set() else 1

    def make_rollout(self, stop_event: threading.Event) -> Rollout:
        context = EngineContext(
            self.cfg, self.model_path, self.tokenizer, stop_event, policy=self.hf_policy
        )
        return get_engine(self.cfg.rollout.backend)(context)

    def loop(self, rollout: Rollout) -> None:
        """Batches until this sampler's share is sent, then wait for the trainer's done."""
        cfg, channel = self.cfg, self.channel
        assert channel is not None
        log.info("waiting for the trainer on %s", cfg.transport.control_addr)
        self.wait_until(lambda: channel.status.seen, "the trainer")
        self.resend(self.spool.pending())  # left by an earlier run; duplicates are dropped
        r = cfg.rollout
        stream = question_stream(
            self.prompts, r.questions_per_step, r.seed, cfg.data.shuffle, start=self.position
        )
        while self.next_seq < self.share:
            # With several samplers, batch seq of this one is about the trainer's step below.
            step_estimate = self.next_seq * r.num_samplers + r.sampler_index
            self.wait_for_version(
                required_version(step_estimate, cfg.train.max_staleness, cfg.train.sync_interval)
            )
            self.wait_until(lambda: not self.spool.full(), "acknowledgements (spool full)")
            if channel.stopped.is_set():
                return
            if self.eval_due():
                self.evaluate(rollout)
            batch = self.make_batch(self.next_seq, stream, rollout)
            self.send_new(batch)
            log.info(
                "sent batch %d (version %d): reward %.3f, %.0f tokens/s",
                batch.seq,
                batch.policy_version,
                mean([e.reward for e in batch.episodes]),
                batch.stats["gen_tokens_per_s"],
            )
        # Bounded: the watch thread sets `stopped` on done, stop, or a silent trainer.
        self.wait_until(lambda: False, "the trainer to finish")

    def finish(self, rollout: Rollout) -> None:
        """After the trainer's done: evaluate the final version, redraw the plot."""
        assert self.channel is not None
        self.sync_with_trainer()  # done carries the final acknowledgements
        if left := self.spool.pending():
            log.warning("%d batches were never acknowledged by the trainer: %s", len(left), left)
        rollout.stop_event = self.signalled  # `stopped` is set by done; only Ctrl-C stops eval
        if self.channel.status.version > self.version:
            self.reload(self.channel.status.version)
        if self.cfg.eval.interval:
            self.evaluate(rollout)
        plot = plot_run(self.run_dir)
        log.info("sampler done: final version %d; plot %s", self.version, plot)


def _stop_on_signals(channel: SamplerChannel) -> threading.Event:
    """Ctrl-C / SIGTERM end generation at the next token and the run cleanly; returns the flag."""
    signalled = threading.Event()

    def handler(signum, frame):
        channel.status.stop_reason = f"{messages.INTERRUPTED} by {signal.Signals(signum).name}"
        signalled.set()
        channel.stopped.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return signalled


def run_sampler(cfg: Config) -> int:
    sampler = Sampler(cfg)
    try:
        return sampler.run()
    finally:
        if sampler.rollout is not None:
            sampler.rollout.close()
