"""eval.engine: sampler: the sampler's engine answers, the trainer scores (grpo.eval.from_sampler,
grpo.sampler.evaluation): answers taken only as asked and from the sampler heard, checked
against the trainer's own questions, scored by the trainer's reward."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from grpo.config import ConfigError, load_config
from grpo.config.rules import eval_engine
from grpo.core.episode import Episode, EpisodeBatch
from grpo.eval.from_sampler import answers_from_wire, answers_to_wire
from grpo.eval.in_training import VersionEvaluator
from grpo.eval.questions import Answered, EvalSpec
from grpo.models.loading import load_tokenizer
from grpo.rollout.base import Generation
from grpo.sampler import evaluation
from grpo.sampler.evaluation import SamplerEvaluation
from grpo.tasks import task_for
from grpo.wire import messages
from grpo.wire.codec import Message, encode_message
from tests.test_transport import connected

DEMO = "configs/cpu_demo.yaml"


def _cfg(base_model_dir, *extra: str):
    return load_config(DEMO, [f"model.path={base_model_dir}", "eval.num_questions=4", *extra])


def _until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _bare_batch() -> EpisodeBatch:
    """Batch 0 of sampler s0 as connected()'s trainer expects it: 1 group of 2, no log-probs."""
    ids = np.arange(2, dtype=np.int32)
    eps = tuple(Episode(ids, ids, None, None, float(i), {}, "stop", 7) for i in range(2))
    return EpisodeBatch(eps, 2, policy_version=0, seq=0, sampler_id="s0")


def test_the_trainer_takes_answers_only_for_the_version_it_asks_of_the_process_heard():
    """Answers for a version not asked, for another trainer process's weights, or from another
    process under the sampler's id are dropped and counted; the sampler's own are taken, and
    the trainer stops asking once it has them."""
    with connected(peer_timeout_s=10, startup_timeout_s=10) as (trainer, sampler):
        got: list = []
        waiting = threading.Thread(target=lambda: got.append(trainer.evaluation(3, lambda: None)))
        waiting.start()
        time.sleep(10 * sampler.transport.heartbeat_s)
        assert sampler.status.evaluate is None  # not asked of a sampler not vouched for
        sampler.send(_bare_batch(), {})  # its first batch vouches for it
        try:
            _until(lambda: sampler.status.evaluate == 3, "the trainer to ask for version 3")
            inc = sampler.status.incarnation
            # Another process, which never heartbeats under the id (one that does is seen as
            # its restart without CURVE: docs/reliability.md)
            ctx = zmq.Context()
            rogue = ctx.socket(zmq.PUSH)
            try:
                rogue.connect(sampler.transport.episodes_addr)
                forged = {"sampler_id": "s0", "incarnation": "f" * 12, "version": 3,
                          "trainer": inc, "answers": ["forged"]}  # fmt: skip
                rogue.send_multipart(encode_message(Message(messages.EVAL, forged)))
                _until(lambda: trainer.asked.refused == 1, "the forger's answers to be dropped")
            finally:
                rogue.close(linger=0)
                ctx.term()
            sampler.channel.send_control(messages.EVAL, version=2, trainer=inc, answers=["v2"])
            sampler.channel.send_control(messages.EVAL, version=3, trainer="x", answers=["old"])
            _until(lambda: trainer.asked.refused == 3, "the unasked answers to be dropped")
            assert not got
            sampler.send_eval(3, ["real"])
            waiting.join(timeout=10)
            assert got == [["real"]]
            _until(lambda: sampler.status.evaluate is None, "the trainer to stop asking")
            assert trainer.counters()["refused_evals"] == 3
        finally:
            waiting.join(timeout=10)


def _generation(ids, finish="stop") -> Generation:
    return Generation(np.zeros(2, np.int32), np.asarray(ids, np.int32), finish)


def test_answers_that_are_not_answers_to_the_trainers_questions_are_refused_by_name():
    spec = EvalSpec.from_config(load_config(None, ["eval.samples=1", "eval.max_new_tokens=4"]))
    prompts = [SimpleNamespace(ids=[1, 2]), SimpleNamespace(ids=[3])]
    answered = [Answered(_generation([5, 6]), (_generation([7], "length"),)) for _ in prompts]
    wire = answers_to_wire(answered)
    back = answers_from_wire(wire, prompts, spec, vocab_size=10)
    assert [a.greedy.completion_ids.tolist() for a in back] == [[5, 6], [5, 6]]
    assert [a.sampled[0].finish_reason for a in back] == ["length", "length"]
    assert back[1].greedy.prompt_ids.tolist() == [3]  # the trainer's own prompt
    ids = lambda *t: np.asarray(t, "<i4").tobytes()  # noqa: E731

    for change, why in (
        ({"greedy": wire["greedy"][:1]}, "1 greedy answers, 2 finish reasons, not 2"),
        ({"sampled": [], "sampled_finish": []}, "0 sampled answers, 0 finish reasons, not 2"),
        ({"greedy": [ids(5, 10), ids(1)]}, r"greedy answer 0: a token id outside .*\[0, 10\)"),
        ({"greedy": [ids(1), ids(-1)]}, "greedy answer 1: a token id outside"),
        ({"greedy": [ids(1) * 5, ids(1)]}, "greedy answer 0: 5 tokens, over 4"),
        ({"greedy": [b"abc", ids(1)]}, "greedy answer 0: token ids are not int32 bytes"),
        ({"sampled": [[1], ids(1)]}, "sampled answer 0: token ids are not int32 bytes"),
        ({"sampled_finish": ["stop", "eos"]}, "sampled answer 1: finish reason 'eos'"),
        ({"greedy": None}, "greedy answers: no lists"),
    ):
        with pytest.raises(ValueError, match=why):
            answers_from_wire({**wire, **change}, prompts, spec, vocab_size=10)
    with pytest.raises(ValueError, match="answers are a list, not a map"):
        answers_from_wire([], prompts, spec, vocab_size=10)


def test_the_trainer_scores_the_answers_with_its_own_reward(base_model_dir):
    """The row of the sampler's answers is the trainer's scoring of their tokens: a correct
    worked answer to question 0 counts, the rest (answer spam, nothing) do not."""
    cfg = _cfg(base_model_dir)
    tok = load_tokenizer(base_model_dir)
    trainer = VersionEvaluator(cfg, tok, rank=0, world=1)
    gold = trainer.prompts[0].row["answer"].split("####")[-1].strip()
    texts = [
        f"Adding up what each of them has gives {gold} in all.\n#### {gold}",
        "#### 2 " * 10,
        "",
        "7",
    ]
    asked = trainer.all_prompts()
    texts += [""] * (len(asked) - len(texts))
    wire = answers_to_wire([Answered(_generation(tok.encode(t, add_special_tokens=False)))
                            for t in texts])  # fmt: skip
    row = trainer.row_from_sampler(wire, 12, 3.0, vocab_size=len(tok))
    assert row["version"] == 12 and row["n"] == 4
    assert row["accuracy"] == row["format_rate"] == 0.25
    assert row["format_rate@reworded"] == 0.0  # the variants' answers are the empty ones
    assert row["seconds"] == 3.0


def test_the_sampler_asks_the_trainers_questions_in_the_trainers_order(base_model_dir):
    """Variants and all: the answers line up with the questions the trainer scores them as."""
    cfg = _cfg(base_model_dir)
    tok = load_tokenizer(base_model_dir)
    ours = SamplerEvaluation(cfg, task_for(cfg), tok).prompts
    theirs = VersionEvaluator(cfg, tok, rank=0, world=1).all_prompts()
    assert len(ours) == 12  # 4 questions, under the run's phrasing and two variants
    assert [list(p.ids) for p in ours] == [list(p.ids) for p in theirs]


class _Endpoint:
    def __init__(self, asked: int | None):
        self.status = SimpleNamespace(evaluate=asked, incarnation="t1")
        self.transport = SimpleNamespace(heartbeat_s=0.01)
        self.stopped = threading.Event()
        self.sent: list = []

    def send_eval(self, version, answers):
        self.sent.append((version, answers))


class _Weights:
    def __init__(self, version: int):
        self.version, self.failed_reloads, self.loaded = version, {}, []

    def reload(self, number: int) -> None:
        self.loaded.append(number)
        self.version = number


class _Engine:
    def __init__(self):
        self.calls = 0

    def generate(self, prompts, sampling):
        self.calls += 1
        assert sampling.greedy
        return [_generation([1, 2]) for _ in prompts]


def test_the_sampler_loads_the_asked_version_answers_once_and_resends_while_still_asked(
    base_model_dir, monkeypatch
):
    cfg = _cfg(base_model_dir)
    answering = SamplerEvaluation(cfg, task_for(cfg), load_tokenizer(base_model_dir))
    endpoint, weights, engine = _Endpoint(asked=12), _Weights(11), _Engine()
    answering.answer_if_asked(endpoint, weights, engine)
    assert weights.loaded == [12]
    assert [(v, len(a["greedy"])) for v, a in endpoint.sent] == [(12, 12)]
    calls = engine.calls
    monkeypatch.setattr(evaluation, "RESEND_BEATS", 10**6)
    answering.answer_if_asked(endpoint, weights, engine)  # asked again at once: nothing
    assert len(endpoint.sent) == 1
    monkeypatch.setattr(evaluation, "RESEND_BEATS", 0)
    answering.answer_if_asked(endpoint, weights, engine)  # still asked: the same answers again
    assert endpoint.sent[1] == endpoint.sent[0] and engine.calls == calls
    endpoint.status.incarnation = "t2"  # a restarted trainer published 12 anew: new answers
    answering.answer_if_asked(endpoint, weights, engine)
    assert len(endpoint.sent) == 3 and engine.calls > calls
    endpoint.status.evaluate = 5  # older than the sampler's weights: not this sampler's to load
    answering.answer_if_asked(endpoint, weights, engine)
    assert len(endpoint.sent) == 3 and weights.loaded == [12]


def test_the_sampler_answers_only_where_it_loads_every_version_in_order():
    for override, why in (
        ("train.max_staleness=1", "train.max_staleness=1 \\(needs 0\\)"),
        ("rollout.mode=continuous", "rollout.mode=continuous \\(needs lockstep\\)"),
        ("train.sync_interval=5", "eval.interval=8 \\(needs a multiple of train.sync_interval"),
    ):
        with pytest.raises(ConfigError, match=f"^eval.engine=sampler: {why}"):
            load_config(DEMO, [override, "eval.engine=sampler"])
        assert eval_engine(load_config(DEMO, [override])) == "trainer"  # auto, the demo's
    assert eval_engine(load_config(DEMO)) == "sampler"
    assert eval_engine(load_config(DEMO, ["eval.engine=trainer"])) == "trainer"
