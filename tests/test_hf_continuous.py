"""The HF continuous engine (grpo.rollout.hf_slots) on the tiny random model: answers
decoded in shared, refilled slots carry the log-probs a fresh forward gives them, a version
change mid-answer shows in each token's version and log-prob, and a restored engine decodes on
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo.models.loading import load_causal_lm, load_tokenizer
from grpo.rollout.hf_slots import HFSlotEngine, sample_rows, uniforms
from grpo.rollout.slots import Answer, SlotRequest
from grpo.scoring.kernels import Truncation, kept_log_mass
from grpo.weights.version import Version

T = 0.9


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir, "float32", "sdpa").eval(), load_tokenizer(tiny_model_dir)


def requests(tokenizer, n: int, max_new: int, first_uid: int = 0) -> list[SlotRequest]:
    """n requests with prompts of different lengths (so the cache has padding)."""
    texts = ["What is 2 + 3?", "Name a prime number larger than ten please.", "Hi"]
    out = []
    for uid in range(first_uid, first_uid + n):
        ids = tokenizer(texts[uid % 3] + " x" * (uid % 4))["input_ids"]
        out.append(
            SlotRequest(uid, np.asarray(ids, np.int32), seed=1000 + uid, max_new_tokens=max_new)
        )
    return out


def run_to_end(engine: HFSlotEngine, todo: list[SlotRequest]) -> list[Answer]:
    """Admit as slots free up, step until every request finished."""
    todo, done = list(todo), []
    while todo or engine.in_flight():
        k = min(len(engine.free_slots()), len(todo))
        engine.admit(todo[:k])
        todo = todo[k:]
        done += engine.step()
    return sorted(done, key=lambda a: a.request.uid)


@torch.no_grad()
def reference_logps(model, answer: Answer, truncation: Truncation) -> np.ndarray:
    """The answer's tokens' log-probs from one forward of the whole sequence, alone (no cache,
    no padding), on the sampled (truncated, renormalised) distribution."""
    prompt = torch.as_tensor(answer.request.prompt_ids, dtype=torch.long)
    ids = torch.cat([prompt, torch.as_tensor(answer.tokens, dtype=torch.long)])[None]
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1] / T  # (1, C, V)
    logp = logits.log_softmax(-1).gather(-1, ids[:, len(prompt) :, None]).squeeze(-1)
    if truncation.active:
        logp = logp - kept_log_mass(logits, truncation)
    return logp[0].numpy()


def test_sample_rows_draws_by_inverse_cdf_from_the_truncated_distribution():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    truncation = Truncation(top_p=0.8, top_k=20)
    u = uniforms([1, 2, 3, 4], [0, 0, 0, 0])
    tokens, logps = sample_rows(logits, 1.0, truncation, u)
    assert (tokens, logps) == sample_rows(logits, 1.0, truncation, u)  # a pure function
    full = logits.log_softmax(-1)
    mass = kept_log_mass(logits[None], truncation)[0]  # (4,)
    for r, (tok, lp) in enumerate(zip(tokens, logps, strict=True)):
        assert lp == pytest.approx(float(full[r, tok] - mass[r]), abs=1e-5)
        assert tok in full[r].topk(20).indices.tolist()  # top-k kept it
    # Without truncation, u = 0.5 picks the token where the CDF crosses one half.
    tok, _ = sample_rows(logits[:1], 1.0, Truncation(), np.array([0.5]))
    cdf = logits[0].softmax(-1).cumsum(-1)
    assert cdf[tok[0]] >= 0.5 and (tok[0] == 0 or cdf[tok[0] - 1] < 0.5)


@pytest.mark.parametrize("truncation", [Truncation(), Truncation(top_p=0.9, top_k=40)])
def test_answers_in_refilled_slots_carry_a_fresh_forwards_logprobs(model_and_tokenizer, truncation):
    model, tokenizer = model_and_tokenizer
    engine = HFSlotEngine(model, tokenizer, slots=3, temperature=T, truncation=truncation)
    answers = run_to_end(engine, requests(tokenizer, 7, max_new=12))
    assert [a.request.uid for a in answers] == list(range(7))  # 7 answers through 3 slots
    for a in answers:
        assert len(a.tokens) == len(a.logps) == len(a.versions)
        assert a.versions == [0] * len(a.tokens)
        assert a.finish_reason == ("stop" if a.tokens[-1] in engine.eos else "length")
        np.testing.assert_allclose(a.logps, reference_logps(model, a, truncation), atol=2e-4)
    assert not engine.in_flight() and engine.free_slots() == [0, 1, 2]


def test_an_answers_tokens_do_not_depend_on_the_slots_it_shares(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    alone = run_to_end(HFSlotEngine(model, tokenizer, 1, T), requests(tokenizer, 1, 10))
    shared = run_to_end(HFSlotEngine(model, tokenizer, 4, T), requests(tokenizer, 5, 10))
    assert shared[0].tokens == alone[0].tokens


@pytest.mark.parametrize("kv_on_update", ["keep", "recompute"])
def test_a_version_changing_mid_answer_shows_in_each_tokens_version_and_logprob(
    model_and_tokenizer, tiny_model_dir, kv_on_update
):
    _, tokenizer = model_and_tokenizer
    model = load_causal_lm(tiny_model_dir, "float32", "sdpa").eval()  # changed below
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = HFSlotEngine(model, tokenizer, 2, T, kv_on_update=kv_on_update)
    engine.admit(requests(tokenizer, 2, max_new=16))
    for _ in range(5):
        assert engine.step() == []
    with torch.no_grad():  # version 1: other weights, in place as the sampler loads them
        torch.manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    engine.load(Version(1, False))  # the sampler loaded its policy: the engine learns it
    answers = run_to_end(engine, [])
    after = {k: v.clone() for k, v in model.state_dict().items()}
    for a in answers:
        assert a.versions == [0] * 5 + [1] * (len(a.tokens) - 5)
        model.load_state_dict(before)
        np.testing.assert_allclose(a.logps[:5], reference_logps(model, a, Truncation())[:5],
                                   atol=2e-4)  # fmt: skip
        model.load_state_dict(after)
        fresh = reference_logps(model, a, Truncation())[5:]
        if kv_on_update == "recompute":  # the old tokens' cache recomputed: a fresh forward's
            np.testing.assert_allclose(a.logps[5:], fresh, atol=2e-4)
        else:  # the new weights read the old weights' cache: not what a fresh forward gives
            assert np.abs(np.asarray(a.logps[5:]) - fresh).max() > 1e-3


def test_a_restored_engine_decodes_on_bit_for_bit(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    todo = requests(tokenizer, 6, max_new=14)
    first = HFSlotEngine(model, tokenizer, 3, T, truncation=Truncation(top_p=0.95))
    first.admit(todo[:3])
    for _ in range(4):
        first.step()
    first.rebuild_cache()  # the sampler's batch cut
    saved = [a.to_state() for a in first.in_flight()]
    assert saved and all(0 < len(s["tokens"]) < 14 for s in saved)
    uninterrupted = run_to_end(first, todo[3:])  # the rest admitted as slots free up

    second = HFSlotEngine(model, tokenizer, 3, T, truncation=Truncation(top_p=0.95))
    second.restore([Answer.from_state(s) for s in saved])
    resumed = run_to_end(second, todo[3:])

    def key(answers):
        return [(a.request.uid, a.slot, a.tokens, a.logps, a.versions, a.finish_reason)
                for a in answers]  # fmt: skip

    assert key(resumed) == key(uninterrupted)
    assert len(resumed) == len(saved) + 3
