"""Issue 44: the config's checks and the placement ask an engine's abilities
(grpo.config.engines), never its name; the built-in engines' abilities are declared once, for
the same names the rollout registry builds."""

from __future__ import annotations

import pytest

from grpo.config import ConfigError, load_config
from grpo.config.engines import BUILT_IN, EngineAbilities, abilities
from grpo.rollout.registry import ENGINES
from grpo.runtime.placement import placement_for

PLUGIN = "tests.plugins.toy_engine:build"


def test_every_built_in_engine_has_its_abilities_declared_and_no_more():
    assert set(BUILT_IN) == set(ENGINES)
    # An engine of your own: what its factory declares, else the defaults.
    assert abilities(PLUGIN) == EngineAbilities(reports_logprobs=True, continuous=True)
    assert abilities("tests.plugins.toy_loss:reinforce") == EngineAbilities()
    with pytest.raises(ConfigError, match="rollout.backend: could not import"):
        abilities("no_such_module:build")


def test_the_checks_ask_the_abilities():
    # vLLM's answers carry their log-probs, so a correction is allowed; an engine's of your
    # own only when its factory declares them.
    load_config(None, ["rollout.backend=vllm", "algo.rollout_correction=icepop"])
    load_config(None, [f"rollout.backend={PLUGIN}", "algo.rollout_correction=icepop"])
    silent = "tests.plugins.toy_loss:reinforce"  # a callable that declares nothing
    with pytest.raises(ConfigError, match="needs the rollout engine's log-probs"):
        load_config(None, [f"rollout.backend={silent}", "algo.rollout_correction=icepop"])
    continuous = ["rollout.mode=continuous", "train.max_staleness=0"]
    load_config(None, [f"rollout.backend={PLUGIN}", *continuous])
    with pytest.raises(ConfigError, match="needs an engine written to slots"):
        load_config(None, [f"rollout.backend={silent}", *continuous])
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
