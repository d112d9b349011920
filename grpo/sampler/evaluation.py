"""eval.engine: sampler: the sampler answers the evaluation the trainer asks for.

The trainer asks in its heartbeats for the answers to version V's evaluation once it has
published V, and waits for them (it trains nothing meanwhile: grpo.trainer.loop). The sampler
answers between batches, in any wait: it loads V if it does not have it yet (the lone, on-policy
sampler the config requires loads V next in any case), generates greedy answers to the same
questions with its engine, and sends the token ids (grpo.eval.from_sampler), which the trainer
scores. Each version is answered once per trainer process: a restarted trainer that asks again
for a version it published anew gets new answers. The same answers are sent again while the
trainer still asks after RESEND_BEATS heartbeats (it drops answers that overtake this process's
first heartbeat, which come by another socket).
"""

from __future__ import annotations

import logging
import time

from grpo.config import Config
from grpo.delivery.sampler_endpoint import SamplerEndpoint
from grpo.eval.from_sampler import answers_to_wire
from grpo.eval.questions import EvalSpec, evaluation_sets, generate_answers
from grpo.rollout.base import RolloutEngine
from grpo.rollout.generate_slots import GenerateSlots
from grpo.rollout.slots import SlotEngine
from grpo.runtime.progress import ACTIVITY, EVALUATING
from grpo.tasks import Task
from grpo.weights.in_use import WeightsInUse

log = logging.getLogger("grpo.sampler")

RESEND_BEATS = 20


def whole_batch_engine(engine: SlotEngine) -> RolloutEngine:
    """The engine behind lock-step slots, which generates whole batches with its own sampling
    (greedy for the evaluation); ValueError for an engine that generates only through slots."""
    if isinstance(engine, GenerateSlots):
        return engine.engine
    raise ValueError(
        f"eval.engine=sampler: the engine ({type(engine).__name__}) generates only through "
        "slots, not whole greedy batches: set eval.engine=trainer"
    )


class SamplerEvaluation:
    """The questions the trainer evaluates, in its order (the run's, then each prompt
    variant's), answered with the sampler's engine when the trainer asks."""

    def __init__(self, cfg: Config, task: Task, tokenizer):
        self.spec = EvalSpec.from_config(cfg)
        sets = evaluation_sets(cfg, task, tokenizer)
        self.prompts = [p for ps in sets.values() for p in ps]
        # (trainer incarnation, version) -> the answers sent, and when
        self.answered: dict[tuple[str | None, int], tuple[dict[str, list], float]] = {}
        self._busy = False  # loading a version waits too: no answering inside an answer

    def answer_if_asked(
        self, endpoint: SamplerEndpoint, weights: WeightsInUse, engine: RolloutEngine
    ) -> None:
        """Answer the evaluation the trainer asks for, once per trainer process and version.
        A version older than the sampler's is not asked by a trainer this sampler follows: it
        is left to the trainer's next word."""
        status = endpoint.status
        version, key = status.evaluate, (status.incarnation, status.evaluate)
        if self._busy or version is None:
            return
        if key in self.answered:
            answers, sent_at = self.answered[key]
            if time.monotonic() - sent_at > RESEND_BEATS * endpoint.transport.heartbeat_s:
                endpoint.send_eval(version, answers)
                self.answered[key] = answers, time.monotonic()
            return
        if version < weights.version:
            return
        if version in weights.failed_reloads:  # serve tries it again, and says why
            return
        self._busy = True
        try:
            if version > weights.version:
                weights.reload(version)
            if weights.version != version or endpoint.stopped.is_set():
                return  # it could not be had (the reason is logged): asked again next beat
            t0 = time.monotonic()
            # Minutes on a CPU (the recipe's 512 answers: 6-10): said, not a silent pause.
            log.info(
                "answering the evaluation of version %d: %d questions", version, len(self.prompts)
            )
            with ACTIVITY.during(EVALUATING, f"version {version}"):
                answered = generate_answers(
                    engine, self.prompts, range(len(self.prompts)), self.spec, version
                )
            answers = answers_to_wire(answered)
            endpoint.send_eval(version, answers)
            self.answered[key] = answers, time.monotonic()
            log.info(
                "answered the evaluation of version %d: %d questions in %.0f s",
                version,
                len(self.prompts),
                time.monotonic() - t0,
            )
        finally:
            self._busy = False
