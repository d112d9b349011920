"""rollout.ignore_eos: every answer exactly max_new_tokens long, on each lockstep engine, so a
benchmark's work cannot change with what the model learns (bench/e2e_vs_trl.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from grpo.config import ConfigError, load_config
from grpo.rollout.base import Sampling

# Answered in a few tokens by the embedded model, well inside the cap, when EOS may end it.
SHORT = "Reply with the single word yes."
CAP = 40


def chat_prompt(tokenizer, text: str) -> np.ndarray:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return np.asarray(tokenizer(rendered, add_special_tokens=False).input_ids, np.int32)


def test_the_config_carries_ignore_eos_into_sampling_without_stop_strings():
    cfg = load_config(None, ["rollout.ignore_eos=true", 'rollout.stop=["####"]'])
    sampling = Sampling.from_config(cfg)
    assert sampling.ignore_eos and sampling.stop == ()
    assert Sampling.from_config(load_config(None, [])).ignore_eos is False


@pytest.mark.parametrize("override", ["rollout.mode=continuous", "rollout.max_turns=2"])
def test_ignore_eos_is_refused_where_answers_are_not_one_generate_call(override):
    extra = ["rollout.tools=[calculator]"] if "turns" in override else []
    with pytest.raises(ConfigError, match="rollout.ignore_eos needs rollout.mode lockstep"):
        load_config(None, ["rollout.ignore_eos=true", override, *extra])


@pytest.mark.slow
def test_hf_answers_run_to_the_cap_past_eos(base_model_dir):
    from grpo.models.loading import load_causal_lm, load_tokenizer
    from grpo.rollout.hf import HFRollout

    tok = load_tokenizer(base_model_dir)
    rollout = HFRollout(load_causal_lm(base_model_dir, "float32", "sdpa").eval(), tok)
    sampling = Sampling(max_new_tokens=CAP, n=4, temperature=0.7, seed=1)
    prompt = [chat_prompt(tok, SHORT)]
    free = rollout.generate(prompt, sampling)
    assert min(len(g.completion_ids) for g in free) < CAP  # EOS ends some: the case is real
    fixed = rollout.generate(prompt, replace(sampling, ignore_eos=True))
    assert [len(g.completion_ids) for g in fixed] == [CAP] * 4
    assert {g.finish_reason for g in fixed} == {"length"}
