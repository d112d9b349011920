"""Multi-turn answers above an engine written to slots (grpo.rollout.tool_slots): the same
answers, masks, log-probs and finish reasons as the loop above a whole-batch engine
(grpo.rollout.multi_turn), each turn a request of its own, and a resume mid-answer that goes on
as the answer that was not interrupted. Runs of the loop with tools under both pacings:
tests/test_generation_loop.py."""

from __future__ import annotations

import numpy as np
import pytest

from grpo.models.loading import load_tokenizer
from grpo.rollout.base import Generation, Sampling
from grpo.rollout.multi_turn import MultiTurnEngine, Turns
from grpo.rollout.slots import Answer, SlotRequest
from grpo.rollout.tool_slots import ToolSlots
from tests.plugins.tool_engine import CALLS, ToolEngine, ToolSlotEngine
from tests.test_multi_turn import CALCULATOR, chat_prompt, ids_of


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def prompt_of(tok) -> np.ndarray:
    return chat_prompt(tok, [{"role": "user", "content": "12 times 7?"}])


def tool_slots(tok, max_turns: int, turn_tokens: int = 0, slots: int = 3) -> ToolSlots:
    engine = ToolSlotEngine(tok, slots, ("</calc>",))
    return ToolSlots(engine, Turns(tok, CALCULATOR, turn_tokens), max_turns, stop=())


def requests(tok, budget: int) -> list[SlotRequest]:
    """Answer j's script is CALLS[j]: a call, a failing call, no call."""
    return [SlotRequest(j, prompt_of(tok), j, budget) for j in range(len(CALLS))]


def finish(slots: ToolSlots) -> None:
    while slots.in_flight():
        slots.step()


def same(a: Answer, g: Generation) -> None:
    got = a.generation()
    assert got.completion_ids.tolist() == g.completion_ids.tolist()
    assert got.loss_mask is not None and g.loss_mask is not None
    assert got.loss_mask.tolist() == g.loss_mask.tolist()
    assert got.rollout_logp is not None and g.rollout_logp is not None
    assert got.rollout_logp.tolist() == g.rollout_logp.tolist()
    assert (got.finish_reason, got.turns, got.tool_calls, got.tool_errors) == (
        g.finish_reason, g.turns, g.tool_calls, g.tool_errors,
    )  # fmt: skip


@pytest.mark.parametrize(
    "case", ["full", "no_room", "one_left", "last_turn", "short_turns", "two_turns"]
)
def test_the_same_answers_as_the_whole_batch_loop(tok, case):
    """Every budget rule of tests/test_multi_turn.py (a result with no room after it, one token
    of room, a call on the last turn, short turns), answer for answer."""
    call, result = len(ids_of(tok, "<calc>12*7</calc>")), len(ids_of(tok, "<result>84</result>"))
    max_turns, budget, turn_tokens = {
        "full": (3, 64, 0),
        "no_room": (3, call + result, 0),
        "one_left": (3, call + result + 1, 0),
        "last_turn": (1, 64, 0),
        "short_turns": (3, 64, 4),
        "two_turns": (2, 64, 0),
    }[case]
    loop = MultiTurnEngine(ToolEngine(tok), tok, CALCULATOR, max_turns, turn_tokens)
    want = loop.generate([prompt_of(tok)], Sampling(n=3, max_new_tokens=budget))
    slots = tool_slots(tok, max_turns, turn_tokens)
    answers = slots.admit(requests(tok, budget))
    finish(slots)
    for a, g in zip(answers, want, strict=True):
        same(a, g)
    assert {a.finish_reason for a in answers} <= {"stop", "length"}


def test_each_turn_is_a_request_into_the_slot_its_answer_freed(tok):
    slots = tool_slots(tok, max_turns=3)
    called, refused, direct = slots.admit(requests(tok, 64))
    finished = slots.step()  # turn 1 of all three: the direct answer is done
    assert finished == [direct] and direct.turns == 1
    assert {a.slot for a in slots.in_flight()} == {called.slot, refused.slot} == {0, 1}
    second = slots.engine.requests[3:]  # type: ignore[attr-defined]
    assert [r.uid for r in second] == [0 * 3 + 1, 1 * 3 + 1]  # uid * max_turns + turn
    turn1, result = ids_of(tok, "<calc>12*7</calc>"), ids_of(tok, "<result>84</result>")
    assert second[0].prompt_ids.tolist() == prompt_of(tok).tolist() + turn1 + result
    assert second[0].max_new_tokens == 64 - len(turn1) - len(result)
    assert slots.step() == [called, refused] and not slots.in_flight()
    # A tool's tokens carry the version of the token before them.
    assert called.versions == [0] * len(called.tokens)


def test_a_resume_mid_answer_goes_on_as_the_answer_that_was_not_interrupted(tok):
    straight = tool_slots(tok, max_turns=3)
    want = straight.admit(requests(tok, 64))
    finish(straight)

    first = tool_slots(tok, max_turns=3)
    first.admit(requests(tok, 64))
    first.step()  # turn 1 done; the calling answers' turn 2 admitted, not yet decoded
    saved = [a.to_state() for a in first.in_flight()]
    resumed = tool_slots(tok, max_turns=3)
    answers = [Answer.from_state(s) for s in saved]
    resumed.restore(answers)
    assert [r.uid for r in resumed.engine.requests] == []  # type: ignore[attr-defined]
    finish(resumed)
    for a in answers:
        same(a, want[a.request.uid].generation())


@pytest.mark.slow  # loads the real model
def test_the_hf_slot_engine_calls_the_calculator_token_in_token_out(base_model_dir):
    """tests/test_multi_turn.py's real-model check, on the HF engine written to slots (the
    continuous one) under ToolSlots: SmolLM2-135M, all but greedy (temperature 1e-4), after two
    worked examples, calls the calculator; the turn stopped at the closing tag, which the
    answer keeps; the result's tokens are exactly its tokenisation, masked; and every token the
    model sampled in either turn is the argmax of one teacher-forced forward over the answer's
    ids, which holds only if the second turn decoded from exactly those ids."""
    import torch

    from grpo.models.loading import load_causal_lm
    from grpo.rollout.hf_slots import HFSlotEngine
    from tests.test_multi_turn import few_shot_prompt

    tok = load_tokenizer(base_model_dir)
    model = load_causal_lm(base_model_dir, "float32", "sdpa").eval()
    engine = HFSlotEngine(model, tok, slots=2, temperature=1e-4, stop=CALCULATOR.stop_strings)
    slots = ToolSlots(engine, Turns(tok, CALCULATOR), max_turns=3, stop=())
    prompt = few_shot_prompt(tok)
    (answer,) = slots.admit([SlotRequest(0, prompt, 0, 40)])
    finish(slots)
    g = answer.generation()
    text = tok.decode(g.completion_ids)
    assert g.tool_calls == 1 and g.turns == 2 and "<calc>12*7</calc>" in text, text
    assert g.loss_mask is not None
    tool = np.flatnonzero(g.loss_mask == 0)
    assert g.completion_ids[tool].tolist() == ids_of(tok, "<result>84</result>"), text
    assert tool.tolist() == list(range(tool[0], tool[-1] + 1))  # one block, between two turns
    assert "</calc>" in tok.decode(g.completion_ids[: tool[0]])  # the closing tag is trained
    with torch.no_grad():
        full = np.concatenate([prompt, g.completion_ids])
        logits = model(torch.as_tensor(full, dtype=torch.long)[None]).logits[0]
        best = logits[len(prompt) - 1 : -1].argmax(-1).numpy()
    model_tokens = g.loss_mask == 1
    assert (g.completion_ids[model_tokens] == best[model_tokens]).all(), text
