"""Issue 44: the config's checks and the placement ask an engine's abilities
(grpo.config.engines), never its name; the built-in engines' abilities are declared once, for
the same names the rollout registry builds."""

from __future__ import annotations

import pytest

from grpo.config import ConfigError, load_config
from grpo.config.engines import BUILT_IN, EngineAbilities, abilities
from grpo.rollout.registry import CONTINUOUS, ENGINES
from grpo.runtime.placement import placement_for

PLUGIN = "tests.plugins.toy_engine:build"


def test_every_built_in_engine_has_its_abilities_declared_and_no_more():
    assert set(BUILT_IN) == set(ENGINES)
    assert {name for name, a in BUILT_IN.items() if a.continuous} == set(CONTINUOUS)
    assert abilities(PLUGIN) == EngineAbilities()  # an engine of your own: the defaults


def test_the_checks_ask_the_abilities():
    # vLLM's answers carry their log-probs, so a correction is allowed; an own engine's not.
    load_config(None, ["rollout.backend=vllm", "algo.rollout_correction=icepop"])
    with pytest.raises(ConfigError, match="needs the rollout engine's log-probs"):
        load_config(None, [f"rollout.backend={PLUGIN}", "algo.rollout_correction=icepop"])
    with pytest.raises(ConfigError, match="continuous runs the hf or vllm engine"):
        load_config(None, [f"rollout.backend={PLUGIN}", "rollout.mode=continuous"])
    stream = ["weights.mode=stream", "transport.weights_addr=tcp://127.0.0.1:5557",
              "model.lora.enabled=true"]  # fmt: skip
    load_config(None, [*stream, "rollout.backend=hf"])  # HF takes a streamed adapter
    with pytest.raises(ConfigError, match="cannot hand the vllm engine a LoRA adapter"):
        load_config(None, [*stream, "rollout.backend=vllm"])


def test_an_engine_spans_the_gpus_its_abilities_say():
    # Two GPUs, one trainer rank: one GPU is left, which vLLM at tensor-parallel 2 outgrows.
    tp = ["rollout.vllm.tensor_parallel_size=2", "train.num_ranks=1"]
    vllm = placement_for(load_config(None, [*tp, "rollout.backend=vllm"]), "both", 2)
    hf = placement_for(load_config(None, [*tp, "rollout.backend=hf"]), "both", 2)
    assert vllm.sampler == (0, 1) and hf.sampler == (1,)
