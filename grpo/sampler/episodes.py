"""Batches of episodes: the groups the generation loop (grpo.sampler.generation) finished,
their rewards, and the old-policy, reference, engine and teacher log-probs of every answer."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from grpo.config import Config
from grpo.config.passes import scored_by
from grpo.core.episode import Episode, EpisodeBatch
from grpo.models.loading import load_reference
from grpo.models.shared_policy import SharedPolicy
from grpo.observe.metrics import peak_memory_gib
from grpo.rollout.base import Generation, Sampling
from grpo.rollout.multi_turn import tool_info
from grpo.runtime.lifetime import restarts
from grpo.runtime.progress import ACTIVITY, REWARDING, SCORING
from grpo.sampler.data import Shard
from grpo.sampler.teacher import teacher_scorer
from grpo.scoring.kernels import Truncation
from grpo.scoring.score import score_for_training
from grpo.tasks import Row
from grpo.tasks.encoding import Prompt
from grpo.weights.in_use import WeightsInUse


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


class BatchMaker:
    """Scores finished groups and makes a batch of them (the generation loop decides which).

    When the sampler computes the log-probs (train.logprobs_on: sampler), scores the answers
    with the HF policy and the reference model, each only if the run needs that pass
    (grpo.config.passes); else the trainer does, and neither is loaded for scoring. `rewards`
    scores the answers (the sampler's, which closes it)."""

    def __init__(
        self,
        cfg: Config,
        tokenizer,
        rewards: AnswerScorer,
        shard: Shard,
        weights: WeightsInUse,
        policy: SharedPolicy,
    ):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.shard = shard
        self.weights = weights
        self.policy = policy
        self.sampling = Sampling.from_config(cfg)
        scored = scored_by(cfg, "sampler")
        self.old_pass = "old_logp" in scored
        self.reference = None
        if self.old_pass:
            policy.module()
        if "ref_logp" in scored:
            self.reference = load_reference(
                policy.model_path, cfg.model.dtype, cfg.model.attn_implementation
            ).to(policy.device)
        # On-policy distillation's teacher (teacher.path), in this process (refused here if its
        # tokenizer differs) or, teacher.where: service, the reward service's through the
        # rewards' connection to it (`teacher_service`, grpo.sampler.rewards).
        self.teacher = None
        if cfg.teacher.path:
            self.teacher = teacher_scorer(
                cfg,
                tokenizer,
                policy.model_path,
                policy.device,
                service_client=getattr(rewards, "teacher_service", None),
            )

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
            **self.weights.stats(),
            "restarts": float(restarts()),  # by launch.sh, so far
        }
        group_size = self.cfg.rollout.group_size
        return EpisodeBatch(episodes, group_size, version, seq, self.cfg.rollout.sampler_id, stats)

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
            self.policy.module() if self.old_pass else None,
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
