"""Rollout engines by name: `rollout.backend` is a name here or a user's `package.module:factory`.

A factory builds an engine from an EngineContext (grpo.rollout.base). The sampler drives every
engine through slots (grpo.rollout.slots.SlotEngine); a factory may instead return an engine
that samples whole batches with one `generate` call (grpo.rollout.base.RolloutEngine), which
`build_engine` puts under the multi-turn loop when the run has tools and then behind slots
(grpo.rollout.generate_slots): lock-step only. A slot engine goes under the slots' multi-turn
loop (grpo.rollout.tool_slots).

The built-in engines are named by where their factory lives, so that looking a name up does
not import vLLM (or anything heavy) until that engine is asked for. What each can do is
declared beside them (grpo.config.engines), for the config's checks.
"""

from __future__ import annotations

from collections.abc import Callable

from grpo.core.registry import Registry
from grpo.rollout.base import EngineContext, RolloutEngine, Sampling
from grpo.rollout.generate_slots import GenerateSlots
from grpo.rollout.multi_turn import with_tools
from grpo.rollout.slots import SlotEngine
from grpo.rollout.tool_slots import with_tool_slots

# A factory returns either kind: an engine written to slots runs both pacings (rollout.mode),
# one that samples whole batches lock-step only (build_engine).
EngineFactory = Callable[[EngineContext], RolloutEngine | SlotEngine]

ENGINES: Registry[EngineFactory] = Registry("rollout engine", callable, "a factory")
ENGINES.add("hf", "grpo.rollout.hf_slots:build")
ENGINES.add("vllm", "grpo.rollout.vllm_slots:build")


def register_engine(name: str, factory: EngineFactory) -> EngineFactory:
    """Add an engine factory under `name`; a name clash is an error, never an overwrite."""
    ENGINES.add(name, factory)
    return factory


check_engine_name = ENGINES.check
get_engine = ENGINES.get


def build_engine(ctx: EngineContext) -> SlotEngine:
    """The engine rollout.backend names, built for the run, as the sampler drives it: with
    rollout.max_turns > 1 under the multi-turn loop that fits it."""
    r = ctx.cfg.rollout
    engine = get_engine(r.backend)(ctx)
    if hasattr(engine, "admit"):  # written to slots
        return with_tool_slots(engine, r, ctx.tokenizer)  # type: ignore[arg-type]
    whole = with_tools(engine, r, ctx.tokenizer)  # type: ignore[arg-type]
    return GenerateSlots(whole, Sampling.from_config(ctx.cfg), r.questions_per_step * r.group_size)
