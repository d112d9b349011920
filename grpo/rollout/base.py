"""What engines generate (Generation), how a call samples (Sampling), what a factory is given
(EngineContext), and the engine that samples whole batches with one call (RolloutEngine).

The sampler drives every engine through slots (grpo.rollout.slots.SlotEngine); a
RolloutEngine is put behind them (grpo.rollout.generate_slots), and evaluation calls its
`generate` directly. A new engine is one module with a factory, named in the config as
`rollout.backend: package.module:factory` or registered under a short name
(grpo.rollout.registry).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from grpo.tools import Toolbox

if TYPE_CHECKING:
    from grpo.config import Config
    from grpo.models.shared_policy import SharedPolicy
    from grpo.weights.version import Version


@dataclass(frozen=True)
class Generation:
    prompt_ids: np.ndarray  # int32 (P,)
    completion_ids: np.ndarray  # int32 (C,), ends with EOS or a stop string when "stop"
    finish_reason: str  # "stop" | "length"
    rollout_logp: np.ndarray | None = None  # float32 (C,), the engine's log-probs, if it has them
    # A multi-turn answer's (grpo.rollout.multi_turn): uint8 (C,), 1 on the tokens the model
    # sampled, 0 on a tool's results; None: every token is the model's (single-turn).
    loss_mask: np.ndarray | None = None
    turns: int = 1  # model turns
    tool_calls: int = 0  # tool results appended
    tool_errors: int = 0  # of which errors
    # Continuous generation (grpo.rollout.slots): int32 (C,), the weights version that
    # sampled each token (an answer in flight across an update has two or more); None: all
    # of it was sampled with the batch's version.
    token_versions: np.ndarray | None = None

    @property
    def sampled_tokens(self) -> int:
        """Tokens the model sampled (a tool's results are not)."""
        return len(self.completion_ids) if self.loss_mask is None else int(self.loss_mask.sum())


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How one generate() call samples: built once from the config (`from_config`; evaluation
    builds its own, grpo.eval.questions.EvalSpec) and varied with `dataclasses.replace` where a
    call differs (a batch's seed, a turn's cap). Each engine reads the fields it uses."""

    max_new_tokens: int  # the cap on each answer's tokens
    n: int = 1  # answers per prompt, contiguous
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    stop: tuple[str, ...] = ()  # an answer ends once its text holds one (kept in the answer)
    greedy: bool = False  # argmax at every step: temperature, top_p and top_k do not apply
    # Every answer exactly max_new_tokens long, EOS and stop strings ignored (rollout.ignore_eos:
    # benchmarks at fixed work).
    ignore_eos: bool = False
    # Seeds the call's sampling where the engine can (HF: torch's RNG); vLLM is seeded once,
    # by rollout.seed, when it starts (grpo.rollout.vllm).
    seed: int = 0
    # Sequences per forward batch where the engine batches them itself (HF); vLLM schedules
    # its own.
    batch_size: int = 16

    def __post_init__(self) -> None:
        # A config's list, or a caller's, frozen as the rest is: the object is shared by calls.
        object.__setattr__(self, "stop", tuple(self.stop))

    @classmethod
    def from_config(cls, cfg: Config) -> Sampling:
        """The sampler's: rollout.group_size answers per question as the rollout section says;
        the seed is the run's (rollout.seed), which the sampler offsets per batch."""
        r = cfg.rollout
        return cls(
            max_new_tokens=r.max_new_tokens,
            n=r.group_size,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            stop=() if r.ignore_eos else tuple(r.stop),
            ignore_eos=r.ignore_eos,
            seed=r.seed,
            batch_size=r.generation_batch_size,
        )


@dataclass(frozen=True)
class EngineContext:
    """What a factory may use to build an engine."""

    cfg: Config
    model_path: Path  # the initial weights (an HF model dir)
    tokenizer: object  # the model's tokenizer (transformers)
    stop_event: threading.Event  # set when the run is stopping: end generate() early
    # The sampler's HF policy, loaded on first use (module()). An engine that samples with it
    # shares the weights the sampler reloads, so its load has nothing to do.
    policy: SharedPolicy

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where an engine written to slots ends a turn: rollout.stop, and with tools
        (rollout.max_turns > 1) their closing tags, so that a turn ends with its call
        (grpo.rollout.tool_slots)."""
        r = self.cfg.rollout
        tools = Toolbox.named(r.tools).stop_strings if r.max_turns > 1 else ()
        return (*r.stop, *tools)


class RolloutEngine(Protocol):
    stop_event: threading.Event  # set when the run is stopping

    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        """`sampling.n` answers per prompt, contiguous (prompt 0's answers first). Returns
        early, with whatever it has, once `stop_event` is set."""
        ...

    def load(self, version: Version) -> Any:
        """Serve the weights of `version` from the next generate() on, all or nothing; raise if
        they cannot be loaded. Whichever way it travelled (grpo.weights.version.Version:
        `version.tensors()` by published name, full weights or a LoRA adapter's, and `vdir`
        where a version dir holds them)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, GPU memory)."""
        ...
