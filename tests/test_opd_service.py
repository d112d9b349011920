"""On-policy distillation's teacher served by the reward service (teacher.where: service): its
log-probs over real sockets equal the in-process teacher's; malformed requests (bad lengths,
out-of-vocabulary ids, wrong dtypes, a bad temperature, too long) are answered with an error and
the service goes on; malformed replies (bad lengths, NaN/inf, wrong dtype) are refused, counted
and resent, never used; a sampler with another tokenizer is stopped with one line; the config's
checks; and a short real run with the teacher in a third process."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from grpo.config import ConfigError, load_config
from grpo.config.rules import serves_teacher, service_scores
from grpo.models.embedded import ModelError
from grpo.models.loading import load_reference, load_tokenizer
from grpo.reward_service import protocol
from grpo.reward_service.backends import ServedTeacher
from grpo.reward_service.client import RemoteTeacher, RewardClient, RewardServiceError
from grpo.scoring.teacher import (
    InProcessTeacher,
    fingerprint_difference,
    tokenizer_fingerprint,
)
from grpo.wire.codec import Message, decode, encode_message
from tests.conftest import free_port, run_launch, transport_overrides
from tests.test_reward_service import at_once, serving

RNG = np.random.default_rng(0)
VOCAB = 1000  # ids drawn below this: within any tokenizer the tests use


def _answers(n: int = 7) -> tuple[list[np.ndarray], list[np.ndarray]]:
    prompts = [RNG.integers(0, VOCAB, int(RNG.integers(1, 9))).astype(np.int32) for _ in range(n)]
    completions = [RNG.integers(0, VOCAB, int(RNG.integers(1, 13))).astype(np.int32)
                   for _ in range(n)]  # fmt: skip
    if n > 2:
        completions[2] = np.zeros(0, np.int32)  # an empty answer: nothing to score, answered
    return prompts, completions


@pytest.fixture(scope="module")
def served_teacher(tiny_model_dir) -> ServedTeacher:
    return ServedTeacher(tiny_model_dir, "float32", batch_size=4, max_tokens=64, packed=False)


@pytest.fixture(scope="module")
def fingerprint(tiny_model_dir) -> dict:
    return tokenizer_fingerprint(load_tokenizer(tiny_model_dir))


# --------------------------------------------------------------------------- the same log-probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_services_teacher_gives_the_in_process_teachers_log_probs(
    tiny_model_dir, served_teacher, fingerprint, temperature
):
    """Requests of 3 answers from two samplers, gathered into shared forwards of 4, against
    the sampler's own teacher scoring all of them at once."""
    tok = load_tokenizer(tiny_model_dir)
    local = InProcessTeacher(load_reference(tiny_model_dir), tok.pad_token_id, 16, packed=False)
    prompts, completions = _answers()
    want = local.logprobs(prompts, completions, temperature)
    with serving(None, teacher=served_teacher, batch_wait_s=0.3) as server:
        clients = [RewardClient(server.addr, batch=3, timeout_s=30, sampler_id=f"s{i}")
                   for i in range(2)]  # fmt: skip
        got = at_once(clients, lambda i, c: RemoteTeacher(c, fingerprint).logprobs(
            prompts, completions, temperature))  # fmt: skip
        assert server.counters.teacher_answers == 2 * len(completions)
        assert server.counters.teacher_calls < 6  # 6 requests, gathered
        assert server.counters.refused == 0
    for logps in got:
        assert [len(x) for x in logps] == [len(c) for c in completions]
        for a, b in zip(logps, want, strict=True):
            assert a.dtype == np.float32
            np.testing.assert_allclose(a, b, atol=2e-5)
    assert all(np.all(x < 0) for x in want if len(x))


def test_requests_at_other_temperatures_gathered_together_each_get_their_own(
    tiny_model_dir, served_teacher, fingerprint
):
    """Two samplers' requests at 1.0 and 0.7 arrive in one gathering window: one forward cannot
    take both temperatures, so each request is answered alone, at its own, and none fails."""
    tok = load_tokenizer(tiny_model_dir)
    local = InProcessTeacher(load_reference(tiny_model_dir), tok.pad_token_id, 16, packed=False)
    prompts, completions = _answers(3)
    temperatures = (1.0, 0.7)
    with serving(None, teacher=served_teacher, batch_wait_s=0.5) as server:
        clients = [RewardClient(server.addr, batch=3, timeout_s=30, sampler_id=f"s{i}")
                   for i in range(2)]  # fmt: skip
        got = at_once(clients, lambda i, c: RemoteTeacher(c, fingerprint).logprobs(
            prompts, completions, temperatures[i]))  # fmt: skip
        assert server.counters.failures == 0 and server.counters.teacher_calls == 2
    for temperature, logps in zip(temperatures, got, strict=True):
        want = local.logprobs(prompts, completions, temperature)
        for a, b in zip(logps, want, strict=True):
            np.testing.assert_allclose(a, b, atol=2e-5)


# --------------------------------------------------------------------------- malformed requests


def _good_body(prompts=None, completions=None, **changes) -> dict:
    p, c = _answers(3) if prompts is None else (prompts, completions)
    body = protocol.teacher_body("r1", p, c, 1.0, {"vocab_size": 1})
    return {**body, **changes}


def _array(values, dtype) -> dict:
    return {"dtype": dtype, "data": np.asarray(values).astype(dtype).tobytes()}


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"prompt_len": _array([1, 1], "int32")}, "completion_len holds 3 values, expected 2"),
        ({"prompt_ids": _array([1, 2], "int32")}, r"prompt_ids holds 2 values, expected \d+"),
        ({"completion_ids": _array([5] * 40, "float32")}, "has dtype 'float32', expected int32"),
        ({"prompt_len": _array([1, 2, 3], "int64")}, "has dtype 'int64', expected int32"),
        ({"prompt_len": {"dtype": "int32", "data": b"\x01\x00"}}, "whole int32 values"),
        ({"prompt_len": [1, 2, 3]}, "must be a map of dtype and data"),
        ({"completion_len": _array([3, -1, 2], "int32")}, "negative length"),
        ({"prompt_len": _array([0, 4, 4], "int32"), "prompt_ids": _array([1] * 8, "int32")},
         "no prompt token"),
        ({"temperature": float("nan")}, "temperature nan is not in"),
        ({"temperature": float("inf")}, "temperature inf is not in"),
        ({"temperature": 0}, "temperature 0 is not in"),
        ({"temperature": "1"}, "temperature '1' is not in"),
        ({"tokenizer": "x"}, "tokenizer must be a map"),
        ({"extra": 1}, r"unexpected \['extra'\]"),
        ({"id": ""}, "non-empty str id"),
    ],
)  # fmt: skip
def test_malformed_teacher_requests_are_refused_with_the_reason(changes, error):
    body = _good_body(
        [np.array([1, 2], np.int32), np.array([3], np.int32), np.array([4, 5, 6], np.int32)],
        [np.array([7], np.int32), np.array([8, 9], np.int32), np.array([1, 1, 1], np.int32)],
        **changes,
    )
    with pytest.raises(ValueError, match=error):
        protocol.parse_teacher_request(body, max_items=4, max_tokens=64, vocab_size=VOCAB)


def test_out_of_vocabulary_ids_and_long_answers_are_refused():
    p, c = [np.array([1, 2], np.int32)], [np.array([3, VOCAB], np.int32)]
    with pytest.raises(ValueError, match=f"completion_ids holds {VOCAB}, outside the teacher"):
        protocol.parse_teacher_request(_good_body(p, c), 4, 64, VOCAB)
    p = [np.array([-1, 2], np.int32)]
    with pytest.raises(ValueError, match="prompt_ids holds -1, outside"):
        protocol.parse_teacher_request(_good_body(p, [np.array([3], np.int32)]), 4, 64, VOCAB)
    p, c = [np.ones(60, np.int32)], [np.ones(5, np.int32)]
    with pytest.raises(ValueError, match=r"answer 0 is 65 tokens, over the teacher's 64 \(teach"):
        protocol.parse_teacher_request(_good_body(p, c), 4, 64, VOCAB)
    p, c = _answers(5)
    with pytest.raises(ValueError, match="5 answers, not in 1..4"):
        protocol.parse_teacher_request(_good_body(p, c), 4, 64, VOCAB)
    rid, request = protocol.parse_teacher_request(_good_body(p[:4], c[:4]), 4, 64, VOCAB)
    assert rid == "r1" and [x.tolist() for x in request.completions] == [x.tolist() for x in c[:4]]


def _ask(addr: str, kind: str, body: dict) -> Message:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(addr)
    try:
        sock.send_multipart(encode_message(Message(kind, body)))
        assert sock.poll(timeout=20000)
        msg = decode(sock.recv_multipart())
        assert isinstance(msg, Message)
        return msg
    finally:
        sock.close()
        ctx.term()


def test_the_service_answers_a_bad_request_with_an_error_and_goes_on(served_teacher, fingerprint):
    p, c = [np.array([1, 2], np.int32)], [np.array([3, 1 << 20], np.int32)]  # out of vocabulary
    with serving(None, teacher=served_teacher) as server:
        bad = _ask(server.addr, protocol.TEACHER, {**_good_body(p, c), "tokenizer": fingerprint})
        assert bad.kind == protocol.ERROR and bad.body["id"] == "r1"
        assert "outside the teacher's vocabulary" in bad.body["reason"]
        scores = _ask(server.addr, protocol.SCORE, {"id": "s", "items": []})
        assert scores.kind == protocol.ERROR and "serves the teacher only" in scores.body["reason"]
        assert _ask(server.addr, protocol.PING, {}).body == {"backend": "", "teacher": True}
        c = [np.array([3, 4], np.int32)]
        good = _ask(server.addr, protocol.TEACHER, {**_good_body(p, c), "tokenizer": fingerprint})
        assert good.kind == protocol.TEACHER_LOGP
        assert len(protocol.parse_teacher_reply(good.body, [2])[0]) == 2
        assert server.counters.refused == 2


def test_a_sampler_with_another_tokenizer_is_stopped_with_one_line(
    tiny_model_dir, served_teacher, fingerprint
):
    tok = load_tokenizer(tiny_model_dir)
    tok.add_tokens(["<student-only>"])
    other = tokenizer_fingerprint(tok)
    assert fingerprint_difference(fingerprint, fingerprint) is None
    assert "vocabularies differ" in fingerprint_difference(other, fingerprint)
    assert "no tokenizer fingerprint" in fingerprint_difference("x", fingerprint)
    eos = {**fingerprint, "special": {**fingerprint["special"], "eos_token": ["<x>", 7]}}
    assert fingerprint_difference(eos, fingerprint).startswith("special token eos_token is '<x>'")
    p, c = _answers(2)
    with serving(None, teacher=served_teacher) as server:
        client = RewardClient(server.addr, timeout_s=10, retries=0)
        with pytest.raises(ModelError) as refused:
            RemoteTeacher(client, other).logprobs(p, c, 1.0)
        client.close()
    line = str(refused.value)
    assert "\n" not in line and f"teacher.path '{tiny_model_dir}' has another tokenizer" in line
    assert "vocabularies differ" in line and line.startswith(f"the reward service at {server.addr}")


# --------------------------------------------------------------------------- malformed replies


@pytest.mark.parametrize(
    ("logp", "error"),
    [
        (_array([-1.0, -2.0], "float32"), "holds 2 values, expected 3"),
        (_array([-1.0, -2.0, -3.0, -4.0], "float32"), "holds 4 values, expected 3"),
        (_array([-1.0, np.nan, -3.0], "float32"), "holds nan"),
        (_array([-1.0, -np.inf, -3.0], "float32"), "holds -inf"),
        (_array([-1.0, -1e30, -3.0], "float32"), "not a finite number within"),
        (_array([-1, -2, -3], "int32"), "has dtype 'int32', expected float32"),
        ({"dtype": "float32", "data": "abc"}, "must be bytes"),
    ],
)
def test_malformed_teacher_replies_are_refused(logp, error):
    with pytest.raises(ValueError, match=error):
        protocol.parse_teacher_reply({"id": "r", "logp": logp}, [1, 2])
    with pytest.raises(ValueError, match="exactly an id and logp"):
        protocol.parse_teacher_reply({"id": "r"}, [1, 2])
    got = protocol.parse_teacher_reply({"id": "r", "logp": _array([-1, -2, -3], "float32")}, [1, 2])
    assert [x.tolist() for x in got] == [[-1.0], [-2.0, -3.0]]


class FakeService:
    """A ROUTER that answers each TEACHER request with what `reply(n, rid, lengths)` makes of
    the n-th request it got: a hostile or broken teacher service."""

    def __init__(self, reply):
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.reply, self.seen, self.stop = reply, 0, threading.Event()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.addr)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(timeout=50):
                continue
            peer, *frames = self.sock.recv_multipart()
            body = decode(frames).body
            lengths = np.frombuffer(body["completion_len"]["data"], np.int32).tolist()
            self.seen += 1
            self.sock.send_multipart([peer, *self.reply(self.seen, body["id"], lengths)])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        self.ctx.term()


def _reply(rid: str, values, dtype: str = "float32") -> list[bytes]:
    return encode_message(
        Message(protocol.TEACHER_LOGP, {"id": rid, "logp": _array(values, dtype)})
    )


def test_a_malformed_reply_is_refused_counted_and_the_request_resent():
    """A NaN, then too few values, then a wrong dtype, then an error; the fifth reply is good:
    only it is taken."""

    def reply(n: int, rid: str, lengths: list[int]) -> list[bytes]:
        total = sum(lengths)
        if n == 1:
            return _reply(rid, [np.nan] * total)
        if n == 2:
            return _reply(rid, [-1.0] * (total - 1))
        if n == 3:
            return _reply(rid, [-1] * total, "int32")
        if n == 4:
            return encode_message(Message(protocol.ERROR, {"id": rid, "reason": "CUDA OOM"}))
        return _reply(rid, -np.arange(1, total + 1, dtype=np.float32))

    fake = FakeService(reply)
    client = RewardClient(fake.addr, timeout_s=0.2, retries=5)
    p, c = [np.array([1], np.int32)] * 2, [np.array([1, 2], np.int32), np.array([3], np.int32)]
    got = RemoteTeacher(client, {}).logprobs(p, c, 1.0)
    assert [x.tolist() for x in got] == [[-1.0, -2.0], [-3.0]]
    assert client.refused == 4 and client.resends == 4
    client.close()
    fake.close()


def test_a_service_that_only_sends_garbage_is_named_after_its_tries():
    fake = FakeService(lambda n, rid, lengths: _reply(rid, [np.inf] * sum(lengths)))
    client = RewardClient(fake.addr, timeout_s=0.2, retries=1)
    started = time.monotonic()
    with pytest.raises(RewardServiceError) as err:
        RemoteTeacher(client, {}).logprobs([np.array([1], np.int32)], [np.ones(3, np.int32)], 1.0)
    assert time.monotonic() - started < 5
    assert re.fullmatch(
        rf"the reward service at {fake.addr} did not answer request \w{{8}} \(1 answers\) within "
        r"0.2 s \(the last reply was refused: the teacher's logp holds inf: .*\), 2 tries: is it "
        r"running \(ROLE=reward\)\? reward.on_service_failure: wait keeps trying",
        str(err.value),
    ), str(err.value)
    assert client.refused == 2
    client.close()
    fake.close()


# --------------------------------------------------------------------------- the config

SERVED = ["algo.advantage=opd", "teacher.path=/big/teacher", "teacher.where=service"]


def test_a_served_teacher_needs_the_service_address():
    with pytest.raises(ConfigError) as e:
        load_config(None, SERVED)
    assert str(e.value).startswith("teacher.where=service needs reward.service_addr")
    assert "\n" not in str(e.value)
    cfg = load_config(None, [*SERVED, "reward.service_addr=tcp://127.0.0.1:5560"])
    assert serves_teacher(cfg) and not service_scores(cfg)  # the teacher alone: no scores
    cfg = load_config(None, [*SERVED, "reward.service_addr=tcp://127.0.0.1:5560",
                             "reward_server.backend=judge", "reward_server.model=/j"])  # fmt: skip
    assert serves_teacher(cfg) and service_scores(cfg)
    cfg = load_config(None, ["reward.service_addr=tcp://127.0.0.1:5560"])
    assert not serves_teacher(cfg) and service_scores(cfg)  # as before
    with pytest.raises(ConfigError, match="teacher.max_tokens=100 is below data.max_prompt"):
        load_config(None, [*SERVED, "reward.service_addr=tcp://127.0.0.1:5560",
                           "teacher.max_tokens=100"])  # fmt: skip


def test_launch_sh_starts_the_service_for_a_served_teacher(monkeypatch, capsys):
    from grpo.cli import launch_env
    from tests.test_launch_path import DEMO

    monkeypatch.setenv("ROLE", "both")
    assert launch_env([DEMO, *SERVED, "reward.service_addr=tcp://127.0.0.1:5560"]) == 0
    assert "REWARD_SERVICE=1" in capsys.readouterr().out.split()


# --------------------------------------------------------------------------- a real run


@pytest.mark.extended  # CI leaves it out; OPD's run: test_opd.py; the service's log-probs: above
@pytest.mark.slow
def test_a_two_step_opd_run_with_the_teacher_in_the_reward_service(
    tmp_path: Path, tiny_model_dir, base_model_dir
):
    """launch.sh with teacher.where=service: the reward service (a third process) loads the
    teacher, the sampler asks it for every answer's log-probs, the trainer's metrics carry the
    reverse KL; the service scored each answer once and no reply was refused."""
    from tests.test_integration import tiny_config
    from tests.tiny_model import build_tiny_model

    teacher = build_tiny_model(tmp_path / "teacher", base_model_dir, seed=1)
    config = tiny_config(
        tmp_path, tiny_model_dir,
        train={"total_steps": 2, "num_ranks": 1},
        algo={"advantage": "opd", "kl_loss_coef": 0.0},
        teacher={"path": str(teacher), "where": "service", "max_tokens": 512},
        reward={"service_addr": f"tcp://127.0.0.1:{free_port()}"},
    )  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 1e-4 < abs(r["opd_reverse_kl"]) < 1, r
        assert r["opd_advantage_mean"] == pytest.approx(-r["opd_reverse_kl"], abs=1e-4), r
        assert r["sampler_teacher_replies_refused"] == 0 and "model_reward_mean" not in r
    served = re.search(r"(\d+) answers' tokens scored by the teacher in (\d+) calls", log)
    assert served, log[-3000:]
    assert int(served.group(1)) == 2 * 16  # each answer once: 2 batches of 4 x 4
