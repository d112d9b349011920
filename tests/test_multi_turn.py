"""Multi-turn answers with tools: the loop over an engine (grpo.rollout.multi_turn) with a
scripted engine and with the real model, and the trainer's side: a tool's tokens count nowhere
in the loss, the KL, the entropy or the advantages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo.algos import kl_penalty, masked_mean
from grpo.config import load_config
from grpo.core.episode import Episode, EpisodeBatch
from grpo.models.loading import load_causal_lm, load_tokenizer
from grpo.plan import plan_experience, plan_objective
from grpo.rollout.base import Sampling
from grpo.rollout.multi_turn import MultiTurnEngine, tool_info, with_tools
from grpo.scoring.forward import pairs_logprobs
from grpo.scoring.kernels import Truncation
from grpo.scoring.score import score_for_training
from grpo.tasks import get_task, score
from grpo.tools import Toolbox, get_tool
from grpo.trainer.step import micro_batch_loss
from tests.experience import build_experience
from tests.plugins.tool_engine import FINAL, LOGP, ToolEngine

CALCULATOR = Toolbox([get_tool("calculator")])
GSM8K_ROW = {"question": "A box holds 12 rows of 7 eggs. How many eggs?", "answer": "#### 84"}


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def chat_prompt(tokenizer, messages: list[dict[str, str]]) -> np.ndarray:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return np.asarray(ids_of(tokenizer, text), np.int32)


def few_shot_prompt(tokenizer) -> np.ndarray:
    """A chat whose two worked examples make SmolLM2-135M call the calculator when greedy."""
    system = ("You have a calculator: write <calc>expression</calc> and its result comes back "
              "as <result>value</result>.")  # fmt: skip
    shots = [("What is 3 times 4?", "<calc>3*4</calc><result>12</result>#### 12"),
             ("What is 15 plus 27?", "<calc>15+27</calc><result>42</result>#### 42")]  # fmt: skip
    messages = [{"role": "system", "content": system}]
    for question, answer in shots:
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]  # fmt: skip
    return chat_prompt(tokenizer, [*messages, {"role": "user", "content": "What is 12 times 7?"}])


# --------------------------------------------------------------------------- the loop


def test_single_turn_runs_keep_their_engine():
    """rollout.max_turns 1: no loop, so no mask and no reward-info keys: batches as before."""
    engine = object()
    assert with_tools(engine, load_config(None, []).rollout, tokenizer=None) is engine
    cfg = load_config(None, ["rollout.max_turns=3", "rollout.tools=[calculator]"]).rollout
    looped = with_tools(engine, cfg, tokenizer=None)
    assert isinstance(looped, MultiTurnEngine) and looped.engine is engine


def test_scripted_turns_are_token_exact_and_masked(tiny_model_dir):
    """Turn 1 calls the calculator, turn 2 answers: the answer's ids are turn 1, the result
    tokenised once, turn 2; the mask is 0 on the result only; the log-probs the trainer
    uses, at the model's tokens, are those of one teacher-forced forward over those ids."""
    tok = load_tokenizer(tiny_model_dir)
    engine = ToolEngine(tok)
    loop = MultiTurnEngine(engine, tok, CALCULATOR, max_turns=3)
    prompt = chat_prompt(tok, [{"role": "user", "content": GSM8K_ROW["question"]}])
    gens = loop.generate([prompt], Sampling(n=3, max_new_tokens=64, seed=1))

    turn1, result = ids_of(tok, "<calc>12*7</calc>"), ids_of(tok, "<result>84</result>")
    turn2 = [*ids_of(tok, FINAL.format(84)), tok.eos_token_id]
    called, refused, direct = gens
    assert called.completion_ids.tolist() == turn1 + result + turn2
    assert called.loss_mask.tolist() == [1] * len(turn1) + [0] * len(result) + [1] * len(turn2)
    assert called.rollout_logp.tolist() == [LOGP] * len(turn1) + [0.0] * len(result) + [LOGP] * len(
        turn2
    )  # the engine has no log-probs of a tool's tokens
    assert (called.finish_reason, called.turns, called.tool_calls, called.tool_errors) == (
        "stop", 2, 1, 0,
    )  # fmt: skip
    assert "<result>error: division by zero</result>" in tok.decode(refused.completion_ids)
    assert (refused.turns, refused.tool_calls, refused.tool_errors) == (2, 1, 1)
    assert direct.loss_mask.tolist() == [1] * len(turn2) and direct.turns == 1
    # Turn 1 for the prompt, n answers; turn 2 for the two that called, one each, on the ids
    # they hold: never text decoded and encoded again.
    assert [(c["n"], len(c["prompts"])) for c in engine.calls] == [(3, 1), (1, 2)]
    assert engine.calls[1]["prompts"][0].tolist() == prompt.tolist() + turn1 + result

    # The reward reads the whole text, the tool's result included; the info says what happened.
    # Only the called answer's working arrives at 84 (its result): the direct one names it first
    # in its marker, so it earns nothing (gsm8k.working_result).
    rewards = [score(get_task("gsm8k").reward, tok.decode(g.completion_ids), GSM8K_ROW)
               for g in gens]  # fmt: skip
    assert [r for r, _ in rewards] == [1.0, 0.0, 0.0]
    assert tool_info(called) == {"turns": 2, "tool_calls": 1, "tool_errors": 0}

    model = load_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        full = np.concatenate([prompt, called.completion_ids])
        logits = model(torch.as_tensor(full, dtype=torch.long)[None]).logits[0]
        forward = logits.log_softmax(-1)[len(prompt) - 1 : -1]  # (C, V): predicts each token
        direct_logp = forward.gather(-1, torch.as_tensor(called.completion_ids).long()[:, None])
    model_tokens = called.loss_mask == 1
    for packed in (False, True):
        old, ref, rollout = score_for_training(
            model, model, [prompt], [called.completion_ids], [called.rollout_logp],
            truncation=Truncation(), pad_id=tok.pad_token_id, temperature=1.0, packed=packed,
        )  # fmt: skip
        want = direct_logp[:, 0].numpy()[model_tokens]
        np.testing.assert_allclose(old[0][model_tokens], want, atol=1e-5)
        np.testing.assert_allclose(ref[0][model_tokens], want, atol=1e-5)
        assert rollout[0].tolist() == called.rollout_logp.tolist()  # top-p 1: as reported


def test_budgets_end_answers_with_length(tiny_model_dir):
    """max_new_tokens bounds the whole answer; a result that leaves no room, a call on the last
    turn and a turn cut by rollout.max_turn_tokens end it with finish_reason 'length'."""
    tok = load_tokenizer(tiny_model_dir)
    prompt = chat_prompt(tok, [{"role": "user", "content": "12 times 7?"}])
    call, result = len(ids_of(tok, "<calc>12*7</calc>")), len(ids_of(tok, "<result>84</result>"))

    def answer(max_turns: int, budget: int, turn_tokens: int = 0):
        loop = MultiTurnEngine(ToolEngine(tok), tok, CALCULATOR, max_turns, turn_tokens)
        return loop.generate([prompt], Sampling(max_new_tokens=budget))[0]

    full = answer(3, 64)
    assert full.finish_reason == "stop" and len(full.completion_ids) < 64
    no_room = answer(3, call + result)  # the result would fill the budget
    assert (no_room.finish_reason, len(no_room.completion_ids), no_room.tool_calls) == (
        "length", call, 0,
    )  # fmt: skip
    one_left = answer(3, call + result + 1)  # room for one more token: the result goes in
    assert len(one_left.completion_ids) == call + result + 1 and one_left.tool_calls == 1
    assert one_left.finish_reason == "length"
    last_turn = answer(1, 64)  # a call with no turn left to read it
    assert (last_turn.finish_reason, last_turn.turns, last_turn.tool_calls) == ("length", 1, 0)
    short_turns = answer(3, 64, turn_tokens=4)
    assert short_turns.finish_reason == "length" and len(short_turns.completion_ids) == 4
    for g in (full, no_room, one_left, last_turn, short_turns):
        assert len(g.loss_mask) == len(g.completion_ids) == len(g.rollout_logp)


@pytest.mark.slow  # loads the real model
def test_the_hf_engine_calls_the_calculator_token_in_token_out(base_model_dir):
    """SmolLM2-135M, greedy, after two worked examples: it calls the calculator. Generation
    stopped at the closing tag, which the answer keeps; the result's tokens are exactly its
    tokenisation, masked; and every token the model sampled in either turn is the argmax of
    one teacher-forced forward over the answer's ids, which only holds if each turn generated
    from exactly those ids."""
    from grpo.rollout.hf import HFRollout

    tok = load_tokenizer(base_model_dir)
    model = load_causal_lm(base_model_dir, "float32", "sdpa").eval()
    loop = MultiTurnEngine(HFRollout(model, tok), tok, CALCULATOR, max_turns=3)
    prompt = few_shot_prompt(tok)
    (g,) = loop.generate([prompt], Sampling(max_new_tokens=40, greedy=True))
    text = tok.decode(g.completion_ids)
    assert g.tool_calls == 1 and g.turns == 2 and "<calc>12*7</calc>" in text, text
    tool = np.flatnonzero(g.loss_mask == 0)
    assert g.completion_ids[tool].tolist() == ids_of(tok, "<result>84</result>"), text
    assert tool.tolist() == list(range(tool[0], tool[-1] + 1))  # one block, between two turns
    assert "</calc>" in tok.decode(g.completion_ids[: tool[0]])  # the closing tag is trained
    with torch.no_grad():
        out = pairs_logprobs(model, [prompt], [g.completion_ids], packed=False,
                             pad_id=tok.pad_token_id)  # fmt: skip
        full = np.concatenate([prompt, g.completion_ids])
        logits = model(torch.as_tensor(full, dtype=torch.long)[None]).logits[0]
        best = logits.log_softmax(-1)[len(prompt) - 1 : -1].max(-1).values.numpy()
    sampled = out.logp[0].numpy()
    model_tokens = g.loss_mask == 1
    np.testing.assert_allclose(sampled[model_tokens], best[model_tokens], atol=1e-4)


# --------------------------------------------------------------------------- the trainer


def _tiny_lm():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


PROMPTS = [np.array([5, 6, 7], np.int32), np.array([8, 9], np.int32)]
COMPLETIONS = [np.array([11, 12, 13, 14, 15, 16, 17, 18], np.int32),
               np.array([21, 22, 23, 24, 25], np.int32)]  # fmt: skip
# 1 = the model's token, 0 = a tool's: a call, a result, an answer; a single-turn one
MASKS = [np.array([1, 1, 0, 0, 0, 1, 1, 1], np.uint8), np.ones(5, np.uint8)]


def _batch(old: list[np.ndarray], ref: list[np.ndarray], masked: bool) -> EpisodeBatch:
    episodes = [
        Episode(PROMPTS[i], COMPLETIONS[i], old[i], ref[i], float(i == 0), {}, "stop", 0,
                loss_mask=MASKS[i] if masked else None)
        for i in range(2)
    ]  # fmt: skip
    return EpisodeBatch(episodes, group_size=2, policy_version=0, seq=0)


def _with_garbage(arrays: list[np.ndarray], value: float) -> list[np.ndarray]:
    """`arrays` with `value` on the tool's tokens."""
    return [
        np.where(m == 1, a, value).astype(np.float32) for a, m in zip(arrays, MASKS, strict=True)
    ]


@pytest.mark.parametrize("loss", ["grpo", "gspo"])
def test_a_tools_tokens_add_nothing_to_the_loss(loss):
    """Old and reference log-probs that are garbage on the tool's tokens leave the loss, its
    gradients and its token count as they were, and the loss is the mean over the model's
    tokens only of the policy, KL and entropy terms; without the mask the garbage counts."""
    cfg = load_config(None, [f"algo.loss={loss}", "algo.kl_loss_coef=0.5",
                             "algo.entropy_coef=0.1", "algo.agg=token-mean"])  # fmt: skip
    model = _tiny_lm()
    with torch.no_grad():
        scored = pairs_logprobs(model, PROMPTS, COMPLETIONS, packed=False, pad_id=0)
    old = [scored.logp[i, : len(c)].numpy() for i, c in enumerate(COMPLETIONS)]
    ref = [o - 0.3 for o in old]  # a reference the policy has drifted from

    def run(batch: EpisodeBatch):
        model.zero_grad()
        exp, _ = build_experience(batch, plan_experience(cfg), kl_coef=0.0)
        loss_t, mask, metrics = micro_batch_loss(model, exp, plan_objective(cfg), pad_id=0)
        loss_t.backward()
        return exp, loss_t.detach(), mask, [p.grad.clone() for p in model.parameters()]

    exp, base, mask, grads = run(_batch(old, ref, masked=True))
    model_tokens = sum(int(m.sum()) for m in MASKS)
    assert exp.loss_tokens() == int(mask.sum()) == model_tokens == 10
    assert (exp.advantages[0, 2:5] == 0).all() and (exp.advantages[0, [0, 1, 5, 6, 7]] != 0).all()
    for value in (25.0, -40.0):
        _, again, _, grads_again = run(_batch(_with_garbage(old, value), _with_garbage(ref, value),
                                              masked=True))  # fmt: skip
        assert torch.allclose(base, again, atol=1e-6)
        for a, b in zip(grads, grads_again, strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    _, unmasked, _, _ = run(_batch(_with_garbage(old, 25.0), _with_garbage(ref, 25.0), False))
    assert not torch.allclose(base, unmasked, atol=1e-3)

    if loss == "grpo":  # ratio 1 (old = this forward's): -A + c_kl * KL - c_ent * H per token
        with torch.no_grad():
            now = pairs_logprobs(model, PROMPTS, COMPLETIONS, packed=False, pad_id=0,
                                 with_entropy=True)  # fmt: skip
            ref_t = torch.nn.functional.pad(torch.as_tensor(ref[1]), (0, 3))
            refs = torch.stack([torch.as_tensor(ref[0]), ref_t])
            m = exp.mask
            want = (masked_mean(-exp.advantages, m)
                    + 0.5 * masked_mean(kl_penalty(now.logp, refs, "k3"), m)
                    - 0.1 * masked_mean(now.entropy, m))  # fmt: skip
        assert torch.allclose(base, want, atol=1e-5)
