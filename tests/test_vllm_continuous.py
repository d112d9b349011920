"""Continuous generation on vLLM (grpo.rollout.vllm_slots) against a real engine: slots
refilled as answers finish, a new version between two steps (both kv_on_update modes), and a
restore of saved answers. One engine for the module (an engine start is the slow part on CPU);
the measured differences are printed (pytest -s)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grpo.models.loading import load_causal_lm, load_tokenizer
from grpo.rollout.slots import Answer, SlotRequest
from grpo.scoring.score import score_pairs
from grpo.weights.version import Version
from tests.test_vllm import (
    MAX_TOL,
    MEAN_TOL,
    QUESTIONS,
    VLLM_MARKS,
    prompts,
    stop_string_at,
    streamed,
    vllm_config,
)

pytestmark = VLLM_MARKS

SLOTS, MAX_NEW = 4, 24


@pytest.fixture(scope="module")
def engine(base_model_dir):
    from grpo.rollout.vllm_slots import VllmSlotEngine

    cfg = vllm_config(
        "rollout.mode=continuous",
        "rollout.questions_per_step=2",
        "rollout.group_size=2",
        f"rollout.max_new_tokens={MAX_NEW}",
        "algo.rollout_correction=decoupled",  # continuous with a lag needs a behaviour weight
    )
    eng = VllmSlotEngine(cfg, base_model_dir)
    assert eng.slots == SLOTS
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_base(base_model_dir):
    return load_causal_lm(base_model_dir, "float32", "sdpa").eval()


@pytest.fixture(scope="module")
def asked(base_model_dir):
    return prompts(load_tokenizer(base_model_dir), QUESTIONS)


def requests(asked, first: int, n: int, max_new: int = MAX_NEW) -> list[SlotRequest]:
    return [SlotRequest(uid, asked[uid % len(asked)], 1000 + uid, max_new)
            for uid in range(first, first + n)]  # fmt: skip


def full_logps(model, answers: list[Answer]) -> list[np.ndarray]:
    """`model`'s log-probs of each answer's tokens, its whole prompt and answer in one forward."""
    p = [np.asarray(a.request.prompt_ids) for a in answers]
    c = [np.asarray(a.tokens, np.int32) for a in answers]
    return score_pairs(model, p, c, pad_id=2, temperature=1.0, packed=False)[0]


def kept_cache_logps(old, new, a: Answer, k: int) -> np.ndarray:
    """kv_on_update: keep. Tokens from k on were sampled by `new` with the cache the old
    weights had computed: that of the prompt and tokens[:k-1] (token k-1, sampled by the last
    old step, is first read by the first new one). Their log-probs under that cache."""
    ids = torch.as_tensor(np.concatenate([a.request.prompt_ids, a.tokens]), dtype=torch.long)
    cut = len(a.request.prompt_ids) + k - 1
    with torch.no_grad():
        cache = old(input_ids=ids[None, :cut], use_cache=True).past_key_values
        logits = new(input_ids=ids[None, cut:-1], past_key_values=cache).logits[0].float()
    logp = logits.log_softmax(-1)
    return logp[torch.arange(len(a.tokens) - k), ids[cut + 1 :]].numpy()


def check_records(answers: list[Answer]) -> None:
    for a in answers:
        assert a.done and len(a.tokens) == len(a.logps) == len(a.versions) > 0
        assert a.finish_reason in ("stop", "length")
        assert len(a.tokens) <= a.request.max_new_tokens
        assert a.finish_reason == "stop" or len(a.tokens) == a.request.max_new_tokens


def test_more_answers_than_slots_refill_and_finish(engine, asked, hf_base, base_model_dir):
    eos = load_tokenizer(base_model_dir).eos_token_id
    total, uid, done, steps = 3 * SLOTS, 0, [], 0
    while len(done) < total:
        free = engine.free_slots()
        n = min(len(free), total - uid)
        if n:
            admitted = engine.admit(requests(asked, uid, n, max_new=8 + 4 * (uid % 5)))
            assert [a.slot for a in admitted] == free[:n]
            uid += n
        assert len(engine.in_flight()) <= SLOTS
        finished = engine.step()
        steps += 1
        assert [a.slot for a in finished] == sorted(a.slot for a in finished)
        assert all(a.slot in engine.free_slots() for a in finished)
        done += finished
        assert steps < 40 * total
    assert not engine.in_flight() and engine.free_slots() == list(range(SLOTS))
    check_records(done)
    assert sorted(a.request.uid for a in done) == list(range(total))
    for a in done:  # an answer that stopped ends with the EOS token it sampled
        assert (a.finish_reason == "stop") == (a.tokens[-1] == eos)
        assert set(a.versions) == {engine.version}
    mean, worst = diffs([np.asarray(a.logps) for a in done], full_logps(hf_base, done))
    print(f"\n{total} answers in {steps} steps through {SLOTS} slots; "
          f"finish reasons {sorted({a.finish_reason for a in done})}; "
          f"vLLM vs HF log-probs: mean |diff| {mean:.2e}, max {worst:.2e}")  # fmt: skip
    assert mean < MEAN_TOL and worst < MAX_TOL


def diffs(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float]:
    d = np.abs(np.concatenate(a) - np.concatenate(b))
    return float(d.mean()), float(d.max())


@pytest.fixture(scope="module")
def new_model(base_model_dir):
    """The base weights, visibly perturbed."""
    model = load_causal_lm(base_model_dir, "float32", "sdpa")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02 * p.std())
    return model.eval()


# recompute: the HF engine's test in CI; here in the extended tier (tests/conftest.py)
@pytest.mark.parametrize("kv", ["keep", pytest.param("recompute", marks=pytest.mark.extended)])
def test_a_version_changes_mid_answer(engine, asked, hf_base, new_model, kv, monkeypatch):
    """Tokens before the update record the old version and the old weights' log-probs; tokens
    after it the new version and the log-probs of the new weights, over a cache of the earlier
    tokens that the old weights computed (keep) or the new ones (recompute)."""
    monkeypatch.setattr(engine.cfg.rollout, "kv_on_update", kv)
    v0 = engine.version
    answers = engine.admit(requests(asked, 100, SLOTS, max_new=MAX_NEW))
    early = []
    for _ in range(6):  # the prefill and five decode steps
        early += engine.step()
    k = 6
    assert all(len(a.tokens) == k for a in answers if a not in early)
    engine.load(Version(v0 + 1, False, state=streamed(new_model, v0 + 1)))
    done = list(early)
    while engine.in_flight():
        done += engine.step()
    check_records(done)
    live = [a for a in answers if len(a.tokens) > k]
    assert live, "every answer ended before the update"
    for a in answers:
        assert a.versions == [v0] * min(k, len(a.tokens)) + [v0 + 1] * (len(a.tokens) - k)
    got_old = [np.asarray(a.logps[:k]) for a in answers]
    want_old = [lp[:k] for lp in full_logps(hf_base, answers)]
    got_new = [np.asarray(a.logps[k:]) for a in live]
    all_new = [lp[k:] for lp in full_logps(new_model, live)]
    kept = [kept_cache_logps(hf_base, new_model, a, k) for a in live]
    want_new = kept if kv == "keep" else all_new
    other = all_new if kv == "keep" else kept
    old_mean, old_max = diffs(got_old, want_old)
    new_mean, new_max = diffs(got_new, want_new)
    other_mean, _ = diffs(got_new, other)
    print(f"\nkv_on_update={kv}: {sum(len(x) for x in got_new)} tokens after the update; "
          f"|vLLM - HF| before {old_mean:.2e} (max {old_max:.2e}), after {new_mean:.2e} "
          f"(max {new_max:.2e}); against the other mode's reference {other_mean:.2e}")  # fmt: skip
    assert old_mean < MEAN_TOL and old_max < MAX_TOL
    assert new_mean < MEAN_TOL and new_max < MAX_TOL
    assert other_mean > 5 * new_mean  # the two modes' references can be told apart
    # back to the base weights for the other tests of this module
    engine.load(Version(v0 + 2, False, state=streamed(hf_base, v0 + 2)))


def test_restored_answers_continue_to_completion(engine, asked, hf_base):
    """Answers saved mid-flight (their JSON state) are restored into an empty engine, into
    their slots, and continue from their tokens under the weights it now serves."""
    answers = engine.admit(requests(asked, 200, SLOTS, max_new=MAX_NEW))
    for _ in range(5):
        engine.step()
    saved = json.loads(json.dumps([a.to_state() for a in engine.in_flight()]))  # as saved
    assert saved and all(not s["finish_reason"] for s in saved)
    while engine.in_flight():  # the first run goes on to its end, emptying the engine
        engine.step()
    restored = [Answer.from_state(s) for s in saved]
    assert [a.to_state() for a in restored] == saved
    engine.restore(restored)
    assert engine.in_flight() == sorted(restored, key=lambda a: a.slot)
    assert set(engine.free_slots()).isdisjoint(a.slot for a in restored)
    done = []
    while engine.in_flight():
        done += engine.step()
    check_records(done)
    assert sorted(a.request.uid for a in done) == sorted(s["uid"] for s in saved)
    for a, s in zip(sorted(done, key=lambda a: a.request.uid),
                    sorted(saved, key=lambda s: s["uid"]), strict=True):  # fmt: skip
        n = len(s["tokens"])
        assert a.tokens[:n] == s["tokens"] and a.logps[:n] == s["logps"] and len(a.tokens) > n
    mean, worst = diffs([np.asarray(a.logps) for a in done], full_logps(hf_base, done))
    print(
        f"\n{len(done)} restored answers continued to {[len(a.tokens) for a in done]} tokens "
        f"(saved at {[len(s['tokens']) for s in saved]}); |vLLM - HF| {mean:.2e}"
    )
    assert mean < MEAN_TOL and worst < MAX_TOL
    assert answers  # the first run's records are its own


def test_an_engine_restart_carries_the_answers_in_flight_over(
    engine, asked, hf_base, base_model_dir, monkeypatch
):
    """rollout.vllm.reload: restart (also the fallback after a failed in-place load) starts a
    new engine: the answers in flight are re-added to it and finish from their tokens so far,
    none lost. (They were dropped, their slots held for ever, and the sampler's loop spun
    without a decode step until the stall watchdog stopped it.)"""
    monkeypatch.setattr(engine.cfg.rollout.vllm, "reload", "restart")
    v0, first = engine.version, engine.llm
    answers = engine.admit(requests(asked, 400, SLOTS))
    done = []
    for _ in range(5):
        done += engine.step()
    before = {a.request.uid: list(a.tokens) for a in answers}
    assert engine.load(Version.from_dir(base_model_dir, v0 + 1)) == "restart"
    assert engine.llm is not first
    for _ in range(4 * MAX_NEW):  # bounded: answers the new engine lost would never finish
        if not engine.in_flight():
            break
        done += engine.step()
    assert not engine.in_flight(), [len(a.tokens) for a in engine.in_flight()]
    check_records(done)
    assert sorted(a.request.uid for a in done) == sorted(before)
    assert all(a.tokens[: len(before[a.request.uid])] == before[a.request.uid] for a in done)
    carried = [a for a in done if len(a.tokens) > len(before[a.request.uid])]
    mean, worst = diffs([np.asarray(a.logps) for a in done], full_logps(hf_base, done))
    print(f"\n{len(carried)} answers in flight carried over an engine restart; |vLLM - HF| "
          f"{mean:.2e}")  # fmt: skip
    assert carried and mean < MEAN_TOL and worst < MAX_TOL


@pytest.mark.extended  # CI leaves it out; restored answers: the test above
def test_a_stop_string_begun_before_a_restore_ends_the_answer(
    engine, asked, base_model_dir, monkeypatch
):
    """Greedy, so the answer is known: a two-token stop string whose first token was saved
    and whose second is the first one sampled after the restore ends it there (vLLM itself
    checks only the text it generated since the restore)."""
    tok = load_tokenizer(base_model_dir)
    monkeypatch.setattr(engine.cfg.rollout, "temperature", 0.0)
    (free,) = engine.admit(requests(asked, 300, 1))
    while engine.in_flight():
        engine.step()
    stop, end = stop_string_at(tok, np.asarray(free.tokens))
    state = json.loads(json.dumps(Answer(free.request, 2).to_state()))
    state.update(tokens=free.tokens[: end - 1], logps=free.logps[: end - 1],
                 versions=free.versions[: end - 1])  # fmt: skip
    monkeypatch.setattr(engine, "stop", (stop,))  # its stop strings, fixed when built
    engine.restore([Answer.from_state(state)])
    done = []
    while engine.in_flight():
        done += engine.step()
    (a,) = done
    print(f"\nstop string {stop!r} begun at token {end - 2} of {len(free.tokens)}, saved up to "
          f"{end - 1}: the restored answer stops with {len(a.tokens)} tokens")  # fmt: skip
    assert a.slot == 2 and a.finish_reason == "stop"
    assert a.tokens == free.tokens[:end] and tok.decode(a.tokens).endswith(stop)
    # Without the engine's own check, vLLM runs past it: the check is needed.
    monkeypatch.setattr(engine, "_stop_across_restore", lambda answer: False)
    engine.restore([Answer.from_state(state)])
    done = []
    while engine.in_flight():
        done += engine.step()
    assert len(done[0].tokens) > end
