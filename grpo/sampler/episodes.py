"""Batches of episodes: G answers per question from the rollout engine, their rewards, DAPO's
dynamic sampling, and the old-policy, reference, engine and teacher log-probs of every answer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from grpo.config import Config
from grpo.config.passes import scored_by
from grpo.core.episode import Episode, EpisodeBatch
from grpo.models.loading import load_reference
from grpo.observe.metrics import peak_memory_gib
from grpo.rollout.base import Generation, RolloutEngine, Sampling
from grpo.rollout.multi_turn import tool_info
from grpo.runtime.lifetime import restarts
from grpo.runtime.progress import ACTIVITY, GENERATING, REWARDING, SCORING
from grpo.sampler.data import Shard
from grpo.sampler.teacher import teacher_scorer
from grpo.sampler.weights import Weights
from grpo.scoring.kernels import Truncation
from grpo.scoring.score import score_for_training
from grpo.tasks import Row
from grpo.tasks.encoding import Prompt
from grpo.wire.channels import PeerError


class AnswerScorer(Protocol):
    """(reward, info) per (completion, row), in order: grpo.sampler.rewards.SamplerRewards."""

    def score_all(self, calls: Sequence[tuple[str, Row]]) -> list[tuple[float, dict]]: ...

    def stats(self) -> dict[str, float]:
        """Counters for the batch's metrics (reward calls timed out, workers replaced...)."""
        ...


@dataclass(frozen=True, eq=False)
class Group:
    """One question's G answers with their (reward, info)."""

    prompt: Prompt
    gens: list[Generation]
    scored: list[tuple[float, dict]]

    def is_flat(self) -> bool:
        return len({reward for reward, _ in self.scored}) == 1


def raise_if_stopped(engine: RolloutEngine) -> None:
    """generate() returns early when told to stop; its partial output must not be used.

    The run's stop reason, when there is one, is the channel's: the loop reports that one."""
    if engine.stop_event.is_set():
        raise PeerError("stopped during generation")


class BatchMaker:
    """Makes batch `seq` from the shard's next questions with the sampler's current weights.

    When the sampler computes the log-probs (train.logprobs_on: sampler), scores the answers
    with the HF policy and the reference model, each only if the run needs that pass
    (grpo.config.passes); else the trainer does, and neither is loaded for scoring. `rewards`
    scores the answers (the sampler's, which closes it)."""

    def __init__(
        self, cfg: Config, tokenizer, rewards: AnswerScorer, shard: Shard, weights: Weights
    ):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.shard = shard
        self.weights = weights
        self.sampling = Sampling.from_config(cfg)
        scored = scored_by(cfg, "sampler")
        self.old_pass = "old_logp" in scored
        self.reference = None
        if self.old_pass:
            weights.hf_policy()
        if "ref_logp" in scored:
            self.reference = load_reference(
                weights.model_path, cfg.model.dtype, cfg.model.attn_implementation
            ).to(weights.device)
        # On-policy distillation's teacher (teacher.path), in this process (refused here if its
        # tokenizer differs) or, teacher.where: service, the reward service's through the
        # rewards' connection to it (`teacher_service`, grpo.sampler.rewards).
        self.teacher = None
        if cfg.teacher.path:
            self.teacher = teacher_scorer(
                cfg, tokenizer, weights.model_path, weights.device,
                service_client=getattr(rewards, "teacher_service", None),
            )  # fmt: skip

    def make(self, seq: int, engine: RolloutEngine) -> EpisodeBatch:
        cfg, Q = self.cfg.rollout, self.cfg.rollout.questions_per_step
        t0, data_start = time.monotonic(), self.shard.position
        kept, flat, rounds, n_tokens = [], [], 0, 0
        # DAPO's dynamic sampling: a group whose answers all score the same has zero advantage
        # and teaches nothing; sample more questions instead, up to max_sampling_rounds.
        while len(kept) < Q and rounds < (cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            prompts = self.shard.draw()
            ACTIVITY.enter(GENERATING, f"batch {seq}")
            seed = self.sampling.seed + seq + rounds * 1_000_003  # per batch and round
            groups = self.sample_groups(prompts, engine, seed)
            rounds += 1
            n_tokens += sum(g.sampled_tokens for group in groups for g in group.gens)
            for g in groups:
                (flat if cfg.dynamic_sampling and g.is_flat() else kept).append(g)
        chosen = (kept + flat)[:Q]  # past the cap, flat groups fill the batch (zero advantage)
        stats = {
            "gen_s": time.monotonic() - t0,
            "gen_tokens": float(n_tokens),
            "sampling_rounds": float(rounds),
            "groups_generated": float(len(kept) + len(flat)),
            "flat_groups_dropped": float(len(flat) - sum(g in chosen for g in flat)),
            "flat_groups_kept": float(sum(g in chosen for g in flat)),
            # Which prompts of this sampler's shard the batch drew: [data_start, data_end).
            "data_start": float(data_start),
        }
        return self.batch(seq, chosen, self.weights.version, stats)

    def batch(self, seq: int, groups: list[Group], version: int, stats: dict) -> EpisodeBatch:
        """Batch `seq` of these groups, sampled with `version` (their oldest), with the
        log-probs the sampler computes and the batch's metrics (`stats` from the caller: its
        gen_s and gen_tokens at least)."""
        t1 = time.monotonic()
        ACTIVITY.enter(SCORING, f"batch {seq}")
        episodes = self.attach_logprobs(groups)
        stats = {
            **stats,
            "logprob_s": time.monotonic() - t1,
            "gen_tokens_per_s": stats["gen_tokens"] / max(stats["gen_s"], 1e-9),
            "reload_s": self.weights.reload_s,
            "data_end": float(stats.get("data_end", self.shard.position)),
            "peak_mem_gib": peak_memory_gib(),
            # Reward calls timed out, workers killed and replaced: totals so far.
            **self.rewards.stats(),
            **self.weights.stream_stats(),
            "restarts": float(restarts()),  # by launch.sh, so far
        }
        group_size = self.cfg.rollout.group_size
        return EpisodeBatch(episodes, group_size, version, seq, self.cfg.rollout.sampler_id, stats)

    def sample_groups(self, prompts: list[Prompt], engine: RolloutEngine, seed: int) -> list[Group]:
        """G answers per prompt, decoded (a tool's results included) and scored, all of the
        round's answers at once, each call within reward.timeout_s (grpo.tasks.runner); a
        multi-turn answer's turns and tool calls go into its reward info."""
        gens = engine.generate([p.ids for p in prompts], replace(self.sampling, seed=seed))
        raise_if_stopped(engine)
        return self.score_groups(prompts, gens)

    def score_groups(self, prompts: list[Prompt], gens: list[Generation]) -> list[Group]:
        """The groups of these answers (G per prompt, contiguous), decoded and scored."""
        G = self.sampling.n
        texts = self.tokenizer.batch_decode(
            [g.completion_ids for g in gens], skip_special_tokens=True
        )
        ACTIVITY.enter(REWARDING, f"{len(texts)} answers")
        calls = [(text, prompts[i // G].row) for i, text in enumerate(texts)]
        scored = [
            (reward, info | tool_info(gen))
            for (reward, info), gen in zip(self.rewards.score_all(calls), gens, strict=True)
        ]
        return [
            Group(prompt, gens[k * G : (k + 1) * G], scored[k * G : (k + 1) * G])
            for k, prompt in enumerate(prompts)
        ]

    def attach_logprobs(self, groups: list[Group]) -> tuple[Episode, ...]:
        """Every answer as an episode, with the old-policy and reference log-probs the sampler
        computes (see the class), the others None; and each token's weights version when the
        engine reports them (continuous generation)."""
        gens = [g for group in groups for g in group.gens]
        scored = [s for group in groups for s in group.scored]
        index = [group.prompt.index for group in groups for _ in group.gens]
        old, ref, rollout = self.score(gens)
        teacher = self.teacher_scores(gens)
        return tuple(
            Episode(
                g.prompt_ids,
                g.completion_ids,
                o,
                r,
                reward,
                info,
                g.finish_reason,
                i,
                lp,
                loss_mask=g.loss_mask,
                teacher_logp=t,
                token_versions=g.token_versions,
            )
            for g, o, r, lp, t, (reward, info), i in zip(
                gens, old, ref, rollout, teacher, scored, index, strict=True
            )
        )

    def score(self, gens: list[Generation]) -> tuple[list, list, list]:
        """(old, reference, rollout) log-probs per answer; None where not computed here
        (see grpo.scoring.score.score_for_training)."""
        # The distribution the answers were sampled from: its temperature and truncation.
        s = self.sampling
        return score_for_training(
            self.weights.policy if self.old_pass else None,
            self.reference,
            [g.prompt_ids for g in gens],
            [g.completion_ids for g in gens],
            [g.rollout_logp for g in gens],
            truncation=Truncation(s.top_p, s.top_k),
            pad_id=self.tokenizer.pad_token_id,
            temperature=s.temperature,
            batch_size=self.cfg.rollout.generation_batch_size,
            packed=self.cfg.packed,
        )

    def teacher_scores(self, gens: list[Generation]) -> list:
        """The teacher's log-probs of each answer's tokens, at the sampling temperature as the
        old ones (so that their difference is OPD's advantage); None each without a teacher.
        The teacher is in this process or in the reward service (grpo.scoring.teacher)."""
        if self.teacher is None:
            return [None] * len(gens)
        return self.teacher.logprobs(
            [g.prompt_ids for g in gens],
            [g.completion_ids for g in gens],
            self.sampling.temperature,
        )
