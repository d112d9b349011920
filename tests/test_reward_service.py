"""The reward service over real ZeroMQ sockets: a tiny random reward model and judge, batching
across samplers, a hung backend noticed and named, every answer scored once; and the pure parts
(the judge's score, the weighted sum, the request checks). A run scored by a reward model that
launch.sh serves is tests/test_plugins.py's."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

import pytest
import torch
import zmq
import zmq.auth

from grpo.models.loading import load_tokenizer
from grpo.reward_service import protocol
from grpo.reward_service.backends import Classifier, Judge, normalised, score_in_reply
from grpo.reward_service.client import RewardClient, RewardServiceError, combine
from grpo.reward_service.protocol import Item
from grpo.reward_service.server import RewardServer
from grpo.wire.codec import Message, encode_message
from tests.conftest import free_port

T = TypeVar("T")

ITEMS = [Item(f"What is {i} + {i}?", f"It is {2 * i}.", str(2 * i)) for i in range(6)]


@contextmanager
def serving(backend, addr: str = "", **kw) -> Iterator[RewardServer]:
    server = RewardServer(addr or f"tcp://127.0.0.1:{free_port()}", backend, **kw)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


class Gated:
    """A backend that scores by answer length once `gate` is set: a hung model until then."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[int] = []

    def score(self, items: Sequence[Item]) -> list[tuple[float, dict]]:
        self.gate.wait()
        self.calls.append(len(items))
        return [(float(len(it.answer)), {"length": len(it.answer)}) for it in items]


def test_reward_model_scores_match_the_model_and_samplers_share_a_forward(classifier_dir):
    backend = Classifier(classifier_dir, "float32", batch_size=16, max_tokens=256)
    with serving(backend, batch_wait_s=0.3) as server:
        a = RewardClient(server.addr, batch=2, sampler_id="a")
        b = RewardClient(server.addr, batch=3, sampler_id="b")
        got: dict[str, list] = {}
        threads = [
            threading.Thread(target=lambda c=c, k=k: got.__setitem__(k, c.score(ITEMS)))
            for c, k in ((a, "a"), (b, "b"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        a.close()
        b.close()
        # 3 + 2 requests from two samplers, gathered into fewer backend calls.
        assert server.counters.requests == 5
        assert server.counters.backend_calls < 5
        assert server.counters.answers == 12
    # The same answer gets the same score whichever batch it was padded into, and it is the
    # model's own logit for the chat-formatted exchange.
    assert [r for r, _ in got["a"]] == pytest.approx([r for r, _ in got["b"]], abs=1e-5)
    tok = load_tokenizer(classifier_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": ITEMS[0].prompt},
         {"role": "assistant", "content": ITEMS[0].answer}], tokenize=False,
    )  # fmt: skip
    with torch.no_grad():
        direct = backend.model(**tok(text, return_tensors="pt")).logits[0, 0].item()
    assert got["a"][0][0] == pytest.approx(direct, abs=1e-5)
    assert got["a"][0][1] == {"rm_score": got["a"][0][0]}


def test_a_tiny_random_judge_answers_with_a_score_or_says_why_not(tiny_model_dir):
    judge = Judge(tiny_model_dir, "float32", "Grade: {prompt} {answer} {reference}", (0, 10),
                  max_new_tokens=6, batch_size=4)  # fmt: skip
    with serving(judge) as server:
        client = RewardClient(server.addr, batch=4)
        scored = client.score(ITEMS[:3])
        client.close()
    assert len(scored) == 3
    for reward, info in scored:
        assert 0.0 <= reward <= 1.0 and "judge_reply" in info
        assert ("judge_score" in info) != ("judge_error" in info)  # gibberish has no score


def test_a_hung_service_is_named_and_a_resent_request_is_scored_once():
    backend = Gated()
    with serving(backend) as server:
        client = RewardClient(server.addr, timeout_s=0.5, retries=1, batch=6)
        started = time.monotonic()
        with pytest.raises(RewardServiceError) as err:
            client.score(ITEMS)
        assert 1.0 <= time.monotonic() - started < 5  # two tries of 0.5 s
        assert re.fullmatch(
            rf"the reward service at {server.addr} did not answer request \w{{8}} \(6 answers\) "
            r"within 0.5 s, 2 tries: is it running \(ROLE=reward\)\? "
            r"reward.on_service_failure: wait keeps trying",
            str(err.value),
        ), str(err.value)
        # The backend comes back: the first send is scored, its resend is not scored again.
        backend.gate.set()
        waiting = RewardClient(server.addr, timeout_s=0.3, retries=0, on_failure="wait", batch=6)
        assert [r for r, _ in waiting.score(ITEMS)] == [float(len(it.answer)) for it in ITEMS]
        time.sleep(0.3)
        assert backend.calls[0] == len(ITEMS)  # the hung request, once
        assert server.counters.answers == sum(backend.calls)
        assert server.counters.repeats >= 1  # its resend was not scored again
        client.close()
        waiting.close()


def test_the_client_waits_through_a_service_restart():
    """reward.on_service_failure: wait: the service at the address takes the request and dies
    (a bare socket that never answers, then closes); a new one takes its address and answers."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    dead = ctx.socket(zmq.ROUTER)
    dead.setsockopt(zmq.LINGER, 0)
    dead.bind(addr)
    client = RewardClient(addr, timeout_s=0.4, retries=0, on_failure="wait", batch=6)
    result: list = []
    thread = threading.Thread(target=lambda: result.extend(client.score(ITEMS[:2])))
    thread.start()
    assert dead.poll(timeout=5000)  # it got the request
    time.sleep(1.0)
    assert client.resends >= 1 and thread.is_alive()
    dead.close()
    ctx.term()
    backend = Gated()
    backend.gate.set()
    with serving(backend, addr=addr):
        thread.join(timeout=20)
    client.close()
    assert [r for r, _ in result] == [float(len(it.answer)) for it in ITEMS[:2]]
    assert backend.calls == [2]  # resends of it queued meanwhile: answered, not scored again


def test_a_failing_backend_scores_zero_with_the_reason():
    class Broken:
        name = "broken"

        def score(self, items):
            raise RuntimeError("CUDA out of memory")

    with serving(Broken()) as server:
        client = RewardClient(server.addr, timeout_s=5)
        scored = client.score(ITEMS[:2])
        client.close()
    assert scored == [(0.0, {"reward_error": "reward service: the reward backend failed: "
                                             "RuntimeError: CUDA out of memory"})] * 2  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "score"),
    [("The answer is right. Score: 9", 9.0), ("score=3.5 because...", 3.5),
     ("Score: 2. On reflection, Score: 7", 7.0), ("It deserves 8", 8.0),
     ("8 out of ten, roughly: wrong", None), ("no idea", None), ("so: -3 .", -3.0),
     ("1.2.3", 2.3), ("10-5", -5.0), ("x.5", 5.0), ("it is 7 -", 7.0), ("--4!", -4.0),
     ("a 12.50\n\n", 12.5), ("", None), ("Score :\t 4", 4.0)],
)  # fmt: skip
def test_the_judges_score_is_the_last_score_or_a_final_number(reply, score):
    assert score_in_reply(reply) == score


@pytest.mark.parametrize(
    "make",
    [lambda n: "1" + " " * n + "x", lambda n: "1" + " -" * (n // 2) + "x",
     lambda n: "score" + " " * n + ":x", lambda n: "7" * n + "x"],
    ids=["blanks", "signs", "score blanks", "digits"],
)  # fmt: skip
def test_reading_the_judges_score_is_linear(make):
    """finding 5: the last-number pattern `(-?\\d+(?:\\.\\d+)?)\\s*\\W*\\s*$` split a run of
    blanks between its three quantifiers, from every start: cubic (0.8 s at 800 characters).
    Times on 100 and 800 characters grow as the text does."""
    from tests.growth import LINEAR_BOUND, time_growth

    assert score_in_reply(make(5000)) is None
    assert score_in_reply(make(5000) + " 6") == 6.0
    assert time_growth(score_in_reply, make, 100) < LINEAR_BOUND


def test_judge_scores_are_scaled_and_clipped():
    assert normalised(7, 0, 10) == pytest.approx(0.7)
    assert normalised(12, 0, 10) == 1.0 and normalised(-1, 0, 10) == 0.0


def test_combine_weights_both_parts_and_keeps_them():
    rule = [(1.0, {"correct": True}), (0.0, {"reward_error": "timeout"})]
    model = [(0.5, {"rm_score": 0.5}), (0.25, {"rm_score": 0.25})]
    out = combine(rule, model, rule_weight=1.0, model_weight=2.0)
    assert out[0] == (2.0, {"correct": True, "rm_score": 0.5, "rule_reward": 1.0,
                            "model_reward": 0.5, "reward/model": 1.0})  # fmt: skip
    assert out[1][0] == 0.5 and out[1][1]["reward_error"] == "timeout"


def test_combine_keeps_gdpo_components_summing_to_the_reward_with_the_judge_apart():
    rule = [(1.1, {"reward/format": 0.1, "reward/answer": 1.0}),
            (0.1, {"reward/format": 0.1, "reward/answer": 0.0})]  # fmt: skip
    model = [(0.8, {}), (0.3, {})]
    out = combine(rule, model, rule_weight=0.5, model_weight=2.0)
    for reward, info in out:
        parts = {k: v for k, v in info.items() if k.startswith("reward/")}
        assert set(parts) == {"reward/format", "reward/answer", "reward/model"}
        assert sum(parts.values()) == pytest.approx(reward)
    assert out[0][1]["reward/model"] == 1.6 and out[0][1]["reward/format"] == 0.05


@pytest.mark.parametrize(
    ("body", "error"),
    [({"items": []}, "non-empty str id"), ({"id": "x", "items": []}, "non-empty list"),
     ({"id": "x", "items": [{"prompt": "q", "answer": 3, "reference": ""}]}, "item 0 needs"),
     ({"id": "x", "items": [{"prompt": "q", "answer": "a", "reference": ""}] * 3}, "over the")],
)  # fmt: skip
def test_malformed_requests_are_refused_with_the_reason(body, error):
    with pytest.raises(ValueError, match=error):
        protocol.parse_request(body, max_items=2)


# ---------------------------------------------------------------------------------------------
# One bad request fails only itself (issue 29, finding 6)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("Grade {answer}, boxed as \\boxed{}", "'{}' is not a placeholder"),
        ("Grade {answer} for {question}", "'{question}' is not a placeholder"),
        ("Grade {answer.upper}", "'{answer.upper}' is not a placeholder"),
        ("Grade {answer", "expected '}' before end of string"),
        ("Grade } {answer}", "Single '}' encountered in format string"),
        ("Grade {prompt}", "no {answer}: the judge would never see the answer"),
        ("Grade {answer:d}", "ValueError: Unknown format code 'd'"),
    ],
)
def test_a_judge_template_that_cannot_be_formatted_is_refused_at_load(template, problem):
    """finding 6: a stray `{}` in reward_server.template (`\\boxed{}`) raised on every judge
    call, and each failure became a reward of 0.0 that was trained on. The config refuses it in
    one line naming the key."""
    from grpo.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, [f"reward_server.template={json.dumps(template)}"])
    message = str(e.value)
    assert message.startswith("reward_server.template: ") and problem in message, message
    assert "\n" not in message
    ok = "Grade {prompt!r}: {answer:>3} ({reference}), as \\boxed{{}}"
    assert load_config(None, [f"reward_server.template={json.dumps(ok)}"]).reward_server.template


class Picky:
    """Scores by answer length, but a batch holding the answer "poison" raises, as a model
    whose input is too long would (CUDA out of memory)."""

    name = "picky"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, items: Sequence[Item]) -> list[tuple[float, dict]]:
        self.calls.append(len(items))
        if any(it.answer == "poison" for it in items):
            raise RuntimeError("CUDA out of memory")
        if any(it.answer == "nan" for it in items):
            return [(float("nan") if it.answer == "nan" else 1.0, {}) for it in items]
        if any(it.answer == "unencodable" for it in items):
            return [(1.0, {"set": {1}}) for it in items]
        return [(float(len(it.answer)), {"length": len(it.answer)}) for it in items]


def at_once(clients: Sequence[RewardClient], ask: Callable[[int, RewardClient], T]) -> list[T]:
    """`ask(i, client)` for each sampler's client in a thread of its own, all within the
    service's gathering wait; the answers in the clients' order (the clients closed)."""
    got: dict[int, T] = {}
    threads = [threading.Thread(target=lambda i=i, c=c: got.__setitem__(i, ask(i, c)))
               for i, c in enumerate(clients)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for c in clients:
        c.close()
    return [got[i] for i in range(len(clients))]


def _score_at_once(addr: str, requests: list[list[Item]]) -> list[list[tuple[float, dict]]]:
    """Each list of items from its own sampler, all sent within the service's gathering wait."""
    clients = [RewardClient(addr, timeout_s=10, retries=0, sampler_id=f"s{i}") for i in
               range(len(requests))]  # fmt: skip
    return at_once(clients, lambda i, c: c.score(requests[i]))


def test_one_bad_request_fails_only_itself():
    """finding 6: one request the backend cannot score failed the whole batch it was gathered
    into, other samplers' requests included. Now those are scored again on their own."""
    backend = Picky()
    good, bad = [Item("q", "four"), Item("q", "sixsix")], [Item("q", "poison")]
    with serving(backend, batch_wait_s=1.0) as server:
        got_good, got_bad = _score_at_once(server.addr, [good, bad])
        assert server.counters.failures >= 1
    assert got_good == [(4.0, {"length": 4}), (6.0, {"length": 6})]
    assert got_bad == [(0.0, {"reward_error": "reward service: the reward backend failed: "
                                              "RuntimeError: CUDA out of memory"})]  # fmt: skip
    assert backend.calls[0] == 3  # gathered into one call first


def test_a_request_that_breaks_its_handling_is_answered_and_the_service_goes_on(monkeypatch):
    """finding 6 / item 2: an error while handling one request (here parse_request raising what
    it never should) ended the serving thread: every later request went unanswered."""
    parse = protocol.parse_request

    def breaks_on_x(body, max_items):
        if body.get("items", [{}])[0].get("answer") == "x":
            raise TypeError("unexpected")
        return parse(body, max_items)

    monkeypatch.setattr(protocol, "parse_request", breaks_on_x)
    with serving(Picky()) as server:
        client = RewardClient(server.addr, timeout_s=5, retries=0)
        (broken,) = client.score([Item("q", "x")])
        assert broken[0] == 0.0 and "TypeError: unexpected" in broken[1]["reward_error"]
        assert client.score([Item("q", "abc")]) == [(3.0, {"length": 3})]
        client.close()


def test_scores_the_wire_cannot_carry_fail_only_their_request():
    """A backend's non-finite score or an info msgpack cannot encode fails its own request,
    answered with the reason, and the service goes on."""
    with serving(Picky()) as server:
        client = RewardClient(server.addr, timeout_s=5, retries=0)
        nan, fine = client.score([Item("q", "nan"), Item("q", "ok")])
        assert nan == (0.0, {"reward_error": "reward service: the backend gave a non-finite "
                                             "score (nan)"})  # fmt: skip
        assert fine == (1.0, {})
        (unencodable,) = client.score([Item("q", "unencodable")])
        assert unencodable[0] == 0.0 and "cannot be sent" in unencodable[1]["reward_error"]
        assert client.score([Item("q", "abc")]) == [(3.0, {"length": 3})]
        client.close()


def test_the_judges_prompt_is_cut_to_its_context(tiny_model_dir):
    """finding 6: the judge never truncated its prompts; one huge answer made its whole batch
    fail (or fill the GPU). Now the question and answer are cut in the middle to fit."""
    judge = Judge(tiny_model_dir, "float32", "Grade: {prompt} {answer} {reference}", (0, 10),
                  max_new_tokens=4, batch_size=4, max_tokens=64)  # fmt: skip
    huge = Item("What is 2 + 2? " * 200, "It is four. " * 2000, "4")
    ids = judge.prompt_ids(huge)
    assert len(ids) <= 64
    text = judge.tokenizer.decode(ids)
    assert "Grade: What is 2 + 2?" in text and "[...]" in text
    scored = judge.score([huge, ITEMS[0]])
    assert len(scored) == 2 and all("reward_error" not in info for _, info in scored)


def test_the_service_has_a_key_of_its_own(tmp_path):
    """finding 11: the reward service loaded trainer.key_secret, so every reward node held the
    trainer's identity. It serves with reward.key_secret now (made 0600), on a node without the
    trainer's secret, and samplers insist on reward.key."""
    from grpo.wire.keys import generate

    curve = tmp_path / "keys"
    generate(curve, samplers=1)
    assert (curve / "reward.key_secret").stat().st_mode & 0o077 == 0
    assert not (curve / "authorized" / "reward.key").exists()  # it serves: nobody accepts it
    (curve / "trainer.key_secret").unlink()  # not on the reward node
    backend = Picky()
    with serving(backend, curve_dir=str(curve)) as server:
        client = RewardClient(server.addr, timeout_s=10, retries=0, curve_dir=str(curve))
        assert client.score([Item("q", "abc")]) == [(3.0, {"length": 3})]
        client.close()
        # A peer that takes the trainer's key for the service's gets no answer.
        impostor = zmq.Context()
        sock = impostor.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        client_pub, client_secret = zmq.auth.load_certificate(curve / "sampler-0.key_secret")
        sock.curve_publickey, sock.curve_secretkey = client_pub, client_secret
        sock.curve_serverkey = zmq.auth.load_certificate(curve / "trainer.key")[0]
        sock.connect(server.addr)
        sock.send_multipart(encode_message(Message(protocol.PING, {})))
        assert not sock.poll(timeout=1000)
        sock.close()
        impostor.term()
