import numpy as np
import pytest

from grpo.sampler.data import Prompt, question_stream
from grpo.sampler.weights import required_version


@pytest.mark.parametrize(
    "seq, staleness, interval, expected",
    [
        (0, 0, 1, 0),
        (1, 0, 1, 1),
        (5, 0, 1, 5),  # on-policy: batch k uses version k
        (1, 1, 1, 0),
        (2, 1, 1, 1),  # one version of lag: overlap sampling and training
        (1, 0, 2, 0),
        (2, 0, 2, 2),
        (3, 0, 2, 2),
        (4, 0, 2, 4),  # only even versions exist
        (3, 1, 2, 2),
        (2, 1, 2, 0),
    ],
)
def test_required_version(seq, staleness, interval, expected):
    assert required_version(seq, staleness, interval) == expected


def _prompts(n):
    return [Prompt(i, {"i": i}, np.array([i], np.int32)) for i in range(n)]


def test_question_stream_covers_each_epoch_once_and_reshuffles():
    stream = question_stream(_prompts(10), 5, seed=3, shuffle=True)
    first = [p.index for p in next(stream)] + [p.index for p in next(stream)]
    second = [p.index for p in next(stream)] + [p.index for p in next(stream)]
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second
    again = question_stream(_prompts(10), 5, seed=3, shuffle=True)
    assert [p.index for p in next(again)] == first[:5]  # seeded: reproducible


def test_question_stream_without_shuffle_wraps_in_order():
    stream = question_stream(_prompts(3), 2, seed=0, shuffle=False)
    assert [[p.index for p in next(stream)] for _ in range(3)] == [[0, 1], [2, 0], [1, 2]]


def test_hf_answers_end_at_the_first_stop_string(base_model_dir):
    """generate() pads a row that hit a stop string with EOS (the pad token here): the answer
    must end where the stop string appeared, as vLLM's does, with no EOS it never sampled."""
    from grpo.models import load_tokenizer
    from grpo.rollout.hf import _cut_at_stop

    tok = load_tokenizer(base_model_dir)
    ids = np.asarray(tok("So the answer is 42. Done").input_ids + [tok.eos_token_id] * 3)
    cut, reason = _cut_at_stop(ids, "stop", tok, ["42."])
    assert reason == "stop" and tok.decode(cut.tolist()).endswith("42.")
    assert "42." not in tok.decode(cut[:-1].tolist())
    same, reason = _cut_at_stop(ids, "length", tok, ["####"])
    assert reason == "length" and same is ids
