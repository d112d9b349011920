"""The sampler's rewards: the task's rule reward for every answer (grpo.tasks.runner: concurrent
calls, each with a time limit), and with `reward.service_addr` the reward service's score too,
weighted and summed (grpo.reward_service.client.combine). With teacher.where: service it also
holds the connection the sampler's teacher asks the service through (`teacher_service`, used by
grpo.sampler.episodes.BatchMaker), stopped and closed with the rest."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from grpo.config import Config
from grpo.config.rules import serves_teacher, service_scores
from grpo.core.columns import VALUE_LIMIT, is_finite_real
from grpo.reward_service.client import RewardClient, Scored, combine
from grpo.reward_service.protocol import Item
from grpo.tasks import RewardRunner, Row, Task, run_reward
from grpo.tasks.base import reward_name
from grpo.tasks.failures import FailureRate

log = logging.getLogger("grpo.sampler")


class SamplerRewards:
    def __init__(self, cfg: Config, task: Task):
        self.cfg, self.task = cfg, task
        r = cfg.reward
        self.rules = RewardRunner(run_reward(task, cfg.data.reward), r.workers, r.timeout_s)
        self.failures = FailureRate(reward_name(task, cfg.data.reward), r.max_error_rate)
        # Scores from the service, unless it serves the teacher alone (service_scores).
        self.service = self._client() if service_scores(cfg) else None
        # Its own socket: a reply to one kind of request never reaches a wait for the other.
        self.teacher_service = self._client() if serves_teacher(cfg) else None

    def _client(self) -> RewardClient:
        cfg, r = self.cfg, self.cfg.reward
        return RewardClient(
            r.service_addr,
            timeout_s=r.service_timeout_s,
            retries=r.service_retries,
            on_failure=r.on_service_failure,
            batch=r.service_batch,
            curve_dir=cfg.transport.curve_dir,
            sampler_id=cfg.rollout.sampler_id,
            max_frame_bytes=cfg.transport.max_frame_bytes,
        )

    def clients(self) -> list[RewardClient]:
        return [c for c in (self.service, self.teacher_service) if c is not None]

    def stop_on(self, event: threading.Event) -> None:
        """Stop waiting for the service when `event` is set (the run stops)."""
        for client in self.clients():
            client.stop_event = event

    def item(self, completion: str, row: Row) -> Item:
        """What the service sees of an answer: the question as the model was asked it (the
        task's last user message), the answer, and the row's reference answer if it has one."""
        prompt = self.task.build_messages(row, "")[-1]["content"]
        return Item(prompt, completion, str(row.get("answer", "")))

    def stats(self) -> dict[str, float]:
        stats = self.rules.stats()
        if self.teacher_service is not None:  # totals so far, as the rule workers' are
            stats["teacher_replies_refused"] = float(self.teacher_service.refused)
            stats["teacher_resends"] = float(self.teacher_service.resends)
        return stats

    def score_all(self, calls: Sequence[tuple[str, Row]]) -> list[Scored]:
        # checked before they are counted: a reward that returns 1e39 on every answer fails as
        # surely as one that raises, and would otherwise train the run on zeros
        rule = checked_rewards(self.rules.score_all(calls))
        self.failures.add(rule)
        if self.service is None:
            return rule
        model = self.service.score([self.item(text, row) for text, row in calls])
        r = self.cfg.reward
        return checked_rewards(combine(rule, model, r.rule_weight, r.model_weight))

    def close(self) -> None:
        self.rules.close()
        for client in self.clients():
            client.close()


def checked_rewards(scored: Sequence[Scored]) -> list[Scored]:
    """Each reward as it is, or, when it is not a finite number within the trainer's bound
    (a reward function's 1e39, weights that push a sum past it), 0 with a reward_error, as a
    failed reward call scores (grpo.tasks.score): the batch is then one the trainer takes,
    where a batch holding it would be refused whole. One line names the answers."""
    out, bad = [], []
    for i, (reward, info) in enumerate(scored):
        if is_finite_real(reward) and abs(reward) <= VALUE_LIMIT:
            out.append((reward, info))
            continue
        bad.append(i)
        why = f"reward {reward!r:.40} is not a finite number within +-{VALUE_LIMIT:g}"
        out.append((0.0, {**info, "reward_error": why}))
    if bad:
        log.warning(
            "answers %s scored a reward that is not a finite number within +-%g: they "
            "score 0 (reward_error)",
            ", ".join(map(str, bad)),
            VALUE_LIMIT,
        )
    return out
