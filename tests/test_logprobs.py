"""grpo.logprobs against naive full-vocabulary references, plus a tiny random Llama."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from grpo.scoring.forward import completion_logprobs, packed_completion_logprobs
from grpo.scoring.kernels import token_logprobs, token_logprobs_and_entropy

B, T, V = 3, 37, 1000


def _data(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)
    labels = torch.randint(0, V, (B, T), generator=g)
    weights = torch.randn(B, T, generator=g)  # a random upstream gradient
    return logits, labels, weights


def _naive(logits, labels, temperature=1.0):
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, labels[..., None]).squeeze(-1)


# chunk_size counts tokens across the batch: 1 -> one position per slice, 7 -> 2 positions
# (does not divide T = 37), 64 -> 21 positions, 10_000 -> a single slice
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_log_softmax(chunk_size, temperature):
    logits, labels, w = _data()
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    out = token_logprobs(a, labels, temperature=temperature, chunk_size=chunk_size)
    ref = _naive(b, labels, temperature)
    assert out.shape == (B, T) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_non_contiguous_and_bf16(temperature):
    logits, labels, w = _data(torch.bfloat16)
    full = torch.cat([logits, logits[:, :1]], dim=1).requires_grad_()  # (B, T + 1, V)
    view = full[:, :-1]  # non-contiguous slice, as model(...).logits[:, p - 1 : -1]
    out = token_logprobs(view, labels, temperature=temperature, chunk_size=16)
    torch.testing.assert_close(out, _naive(logits, labels, temperature), atol=1e-5, rtol=0)
    (out * w).sum().backward()
    assert full.grad.dtype == torch.bfloat16
    ref = logits.float().requires_grad_()
    (_naive(ref, labels, temperature) * w).sum().backward()
    got, want = full.grad[:, :-1].float(), ref.grad
    # The gradient is g_t / T * (onehot(y_t) - p_tv): computed in float32 from the same
    # (bf16-valued) logits on both sides, then rounded once to bf16 on ours. Entry by entry:
    # - rounding to bf16 (8 significant bits, unit roundoff u = 2^-8): <= u * |entry|;
    # - float32 (eps = 2^-24) on each side: p_tv = exp(z_tv - lse_t), with lse_t a log of a
    #   sum of V positive terms (relative error <= V * eps, whatever the summation order) and
    #   the exponent's argument rounded (|z - lse| < 64 here: <= 64 * eps), so p carries a
    #   relative error <= (V + 128) * eps per side; both sides, 2 * 1128 eps < 2^-12, of the
    #   softmax term |g_t / T| * p_tv. The label's entry adds its own subtraction, g - g p,
    #   <= eps * |entry| per side (2^-22 covers both, and u's rounding of the difference).
    # So |got - want| <= (2^-8 + 2^-22) |want| + 2^-12 |g_t / T| p_tv. Measured: 0.93 of that
    # bound here, 0.99 at most over 20 seeds (the rounding to bf16 alone reaches 0.996 u;
    # the float32 part, at most 67 eps of the softmax term; |z - lse| <= 38). ~99% of the
    # entries are below 1e-2 (median 7e-6 at T = 1), so the bound is relative to each entry,
    # not an absolute 1e-2: a gradient 1% off, or one missing the label's own -g p term
    # (some p_y here are > 2^-8), fails.
    p = F.softmax(logits.float() / temperature, dim=-1)
    softmax_term = (w / temperature).abs()[..., None] * p
    bound = (2**-8 + 2**-22) * want.abs() + 2**-12 * softmax_term
    excess = ((got - want).abs() - bound).max()
    assert excess <= 0, f"gradient beyond its bound by {float(excess):.2e}"
    assert torch.equal(full.grad[:, -1], torch.zeros_like(full.grad[:, -1]))


def test_token_logprobs_gradcheck_double():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    # forward is float32 internally, so check the hand-written backward against autograd
    # on the naive float32 formula rather than with finite differences
    out = token_logprobs(logits, labels, temperature=1.3, chunk_size=3)
    (out.sum()).backward()
    ref = logits.detach().float().requires_grad_()
    _naive(ref, labels, 1.3).sum().backward()
    torch.testing.assert_close(logits.grad.float(), ref.grad, atol=1e-6, rtol=1e-5)
    assert logits.grad.dtype == torch.float64


@pytest.mark.parametrize("chunk_size", [5, 10_000])
def test_entropy_matches_naive(chunk_size):
    logits, labels, _ = _data()
    for temperature in (1.0, 0.5):
        p = F.softmax(logits / temperature, dim=-1)
        naive = -(p * F.log_softmax(logits / temperature, dim=-1)).sum(-1)
        _, out = token_logprobs_and_entropy(
            logits, labels, temperature=temperature, chunk_size=chunk_size
        )
        torch.testing.assert_close(out, naive, atol=1e-4, rtol=1e-5)
    # uniform logits -> log V
    _, flat = token_logprobs_and_entropy(torch.zeros(1, 2, V), labels[:1, :2])
    torch.testing.assert_close(flat, torch.full((1, 2), torch.log(torch.tensor(V * 1.0)).item()))


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_fused_logprobs_and_entropy_match_naive_ones(temperature):
    logits, labels, w = _data()
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    logp, entropy = token_logprobs_and_entropy(a, labels, temperature=temperature, chunk_size=9)
    ref = _naive(b, labels, temperature)
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
    p = F.softmax(logits / temperature, dim=-1)
    naive = -(p * F.log_softmax(logits / temperature, dim=-1)).sum(-1)
    torch.testing.assert_close(entropy, naive, atol=1e-4, rtol=1e-5)
    assert not entropy.requires_grad  # a metric: no gradient flows through it
    (logp * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)
    assert torch.equal(logits, a.detach())  # float32 at temperature 1 is read in place, not written


def test_chunk_size_must_be_positive():
    logits, labels, _ = _data()
    with pytest.raises(ValueError):
        token_logprobs(logits, labels, chunk_size=0)


# ---------------------------------------------------------------- with a real (tiny) model


def _tiny_llama_config(**more) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        **more,
    )


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(_tiny_llama_config()).eval()


PAD = 0


def _left_padded_batch():
    # row 0: prompt of 3 tokens left-padded to 5, completion of 3 tokens right-padded to 4
    # row 1: full prompt of 5 tokens, completion of 4 tokens
    prompts = [[11, 12, 13], [21, 22, 23, 24, 25]]
    completions = [[31, 32, 33], [41, 42, 43, 44]]
    prompt_len, comp_len = 5, 4
    ids, mask = [], []
    for p, c in zip(prompts, completions, strict=True):
        lpad, rpad = prompt_len - len(p), comp_len - len(c)
        ids.append([PAD] * lpad + p + c + [PAD] * rpad)
        mask.append([0] * lpad + [1] * (len(p) + len(c)) + [0] * rpad)
    return prompts, completions, torch.tensor(ids), torch.tensor(mask), prompt_len


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_completion_logprobs_left_padding_invariant(tiny_llama, temperature):
    prompts, completions, ids, mask, prompt_len = _left_padded_batch()
    with torch.no_grad():
        logp, ent = completion_logprobs(
            tiny_llama, ids, mask, prompt_len, temperature=temperature, with_entropy=True
        )
    assert logp.shape == ent.shape == (2, ids.shape[1] - prompt_len)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        alone = torch.tensor([p + c])
        with torch.no_grad():
            lp1, ent1 = completion_logprobs(
                tiny_llama, alone, torch.ones_like(alone), len(p),
                temperature=temperature, with_entropy=True,
            )  # fmt: skip
            # reference straight from the model's logits, no helper involved
            logits = tiny_llama(alone).logits[0, len(p) - 1 : -1].float() / temperature
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        n = len(c)
        torch.testing.assert_close(lp1[0], ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(logp[i, :n], ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, :n], ent1[0], atol=1e-5, rtol=0)
        assert torch.isfinite(logp[i]).all()


def test_completion_logprobs_is_differentiable(tiny_llama):
    _, _, ids, mask, prompt_len = _left_padded_batch()
    logp, ent = completion_logprobs(tiny_llama, ids, mask, prompt_len)
    assert ent is None
    comp_mask = mask[:, prompt_len:].float()
    (logp * comp_mask).sum().backward()
    grad = tiny_llama.model.embed_tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    tiny_llama.zero_grad(set_to_none=True)
    with pytest.raises(ValueError):
        completion_logprobs(tiny_llama, ids, mask, ids.shape[1])


def test_entropy_with_grad_matches_the_naive_formula_and_its_gradient():
    from grpo.scoring.kernels import token_entropy_with_grad

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 50, requires_grad=True)
    naive_logits = logits.detach().clone().requires_grad_(True)
    got = token_entropy_with_grad(logits, temperature=0.7, chunk_size=3)
    p = torch.softmax(naive_logits / 0.7, dim=-1)
    naive = -(p * torch.log_softmax(naive_logits / 0.7, dim=-1)).sum(-1)
    assert torch.allclose(got, naive, atol=1e-5)
    weights = torch.randn(2, 5)
    (got * weights).sum().backward()
    (naive * weights).sum().backward()
    assert torch.allclose(logits.grad, naive_logits.grad, atol=1e-5)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_packed_logprobs_equal_padded_ones_with_gradients(tiny_llama, entropy_grad):
    import numpy as np

    from grpo.core.batching import pack_pairs, pad_pairs

    prompts = [np.array(p) for p in ([11, 12, 13], [21, 22, 23, 24, 25], [7])]
    completions = [np.array(c) for c in ([31, 32, 33], [41, 42, 43, 44], [])]
    packed = pack_pairs(prompts, completions)
    assert packed.input_ids.shape == (1, 3 + 3 + 5 + 4 + 1)  # no padding at all
    padded = pad_pairs(prompts, completions, PAD)
    results = []
    for run in ("packed", "padded"):
        tiny_llama.zero_grad()
        if run == "packed":
            logp, ent = packed_completion_logprobs(
                tiny_llama, packed, temperature=0.7, with_entropy=True, entropy_grad=entropy_grad
            )
        else:
            logp, ent = completion_logprobs(
                tiny_llama, padded.input_ids, padded.attention_mask, padded.prompt_len,
                temperature=0.7, with_entropy=True, entropy_grad=entropy_grad,
            )  # fmt: skip
        mask = padded.response_mask
        torch.testing.assert_close(mask, packed.response_mask)
        ((logp * mask).sum() + (ent * mask).sum() * entropy_grad).backward()
        grads = [p.grad.clone() for p in tiny_llama.parameters()]
        results.append((logp * mask, ent * mask, grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=0)
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_packed_logprobs_all_empty_completions_still_backpropagate(tiny_llama):
    import numpy as np

    from grpo.core.batching import pack_pairs

    packed = pack_pairs([np.array([1, 2]), np.array([3])], [np.array([]), np.array([])])
    logp, _ = packed_completion_logprobs(tiny_llama, packed)
    assert logp.shape == (2, 1)
    (logp * packed.response_mask).sum().backward()  # zero loss, but a valid graph


def test_packed_logprobs_through_a_lora_model(tiny_llama):
    """peft's wrapper must pass position_ids and index-valued logits_to_keep through."""
    import copy

    import numpy as np
    from peft import LoraConfig, get_peft_model

    from grpo.core.batching import pack_pairs, pad_pairs

    model = get_peft_model(
        copy.deepcopy(tiny_llama), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])
    )
    prompts = [np.array([11, 12, 13]), np.array([21, 22])]
    completions = [np.array([31, 32]), np.array([41, 42, 43])]
    packed = packed_completion_logprobs(model, pack_pairs(prompts, completions))[0]
    padded = pad_pairs(prompts, completions, PAD)
    ref = completion_logprobs(model, padded.input_ids, padded.attention_mask, padded.prompt_len)[0]
    mask = padded.response_mask
    torch.testing.assert_close(packed * mask, ref * mask, atol=1e-5, rtol=0)


def test_critic_values_are_its_head_at_the_policys_positions_padded_or_packed():
    """The critic reads its values from the policy's forward (completion_outputs): value t is
    the one-label head's output at the position that predicts completion token t."""
    import numpy as np

    from grpo.trainer.critic import completion_values

    torch.manual_seed(0)
    critic = transformers.LlamaForTokenClassification(_tiny_llama_config(num_labels=1)).eval()
    prompts = [np.array(p) for p in ([11, 12, 13], [21, 22, 23, 24, 25], [7])]
    completions = [np.array(c) for c in ([31, 32, 33], [41, 42, 43, 44], [])]
    with torch.no_grad():
        padded, mask = completion_values(critic, prompts, completions, False, PAD)
        packed, packed_mask = completion_values(critic, prompts, completions, True, PAD)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            alone = critic(torch.tensor([[*p, *c]])).logits[0, len(p) - 1 : -1, 0]
            torch.testing.assert_close(padded[i, : len(c)], alone, atol=1e-5, rtol=0)
            torch.testing.assert_close(packed[i, : len(c)], alone, atol=1e-5, rtol=0)
    assert padded.shape == (3, 4) and torch.equal(mask, packed_mask)


@pytest.mark.parametrize("top_p,top_k", [(0.9, 0), (0.5, 0), (1.0, 7), (0.8, 20), (0.0001, 0)])
def test_kept_log_mass_matches_transformers_warpers(top_p, top_k):
    """The kept set is HF's (and vLLM's): temperature, then top-k, then top-p."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from grpo.scoring.kernels import Truncation, kept_log_mass

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50) * 3
    got = kept_log_mass(logits, Truncation(top_p, top_k), temperature=0.7, chunk_size=4)
    z = (logits / 0.7).reshape(-1, 50)
    warped = z.clone()
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(None, warped)
    kept = torch.isfinite(warped)
    want = z.log_softmax(-1).masked_fill(~kept, -torch.inf).logsumexp(-1).view(3, 5)
    assert torch.allclose(got, want, atol=1e-6)
    assert (got <= 1e-6).all()
    if top_p == 0.0001 and not top_k:  # only the most likely token is left
        assert torch.allclose(got, z.log_softmax(-1).max(-1).values.view(3, 5), atol=1e-6)


def test_pairs_logprobs_reports_kept_mass_only_when_truncating(tiny_llama):
    from grpo.scoring.forward import pairs_logprobs
    from grpo.scoring.kernels import Truncation

    prompts = [torch.arange(3, 8).numpy(), torch.arange(10, 13).numpy()]
    completions = [torch.arange(20, 24).numpy(), torch.arange(30, 32).numpy()]
    args = dict(packed=False, pad_id=0, temperature=1.0)
    with torch.no_grad():
        plain = pairs_logprobs(tiny_llama, prompts, completions, **args)
        off = pairs_logprobs(tiny_llama, prompts, completions, truncation=Truncation(), **args)
        on = pairs_logprobs(
            tiny_llama, prompts, completions, truncation=Truncation(top_p=0.5), **args
        )
        packed = pairs_logprobs(
            tiny_llama, prompts, completions, truncation=Truncation(top_p=0.5),
            **(args | {"packed": True}),
        )  # fmt: skip
    assert plain.log_kept_mass is None and off.log_kept_mass is None
    assert on.log_kept_mass is not None and torch.equal(on.logp, plain.logp)
    valid = on.mask.bool()
    assert (on.log_kept_mass[valid] < 0).all()
    assert torch.allclose(packed.log_kept_mass[valid], on.log_kept_mass[valid], atol=1e-5)


def test_the_packed_forward_feeds_the_model_one_row_of_the_real_tokens(tiny_model_dir):
    """packed=True puts the pairs end to end in one row (no padding computed), padded puts them
    in a rectangle: the shapes the model is fed, counted by a hook on its forward."""
    from grpo.models.loading import load_reference
    from grpo.scoring.forward import completion_outputs

    model = load_reference(tiny_model_dir)
    fed: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(
        lambda _m, _args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    prompts = [np.array([1, 2, 3], np.int32), np.array([4], np.int32)]
    completions = [np.array([5, 6], np.int32), np.array([7, 8, 9, 10], np.int32)]
    completion_outputs(model, prompts, completions, packed=True, pad_id=0)
    completion_outputs(model, prompts, completions, packed=False, pad_id=0)
    assert fed == [(1, 10), (2, 7)]  # 10 real tokens in one row; two of 3 + 4 padded
