"""Continuous generation on vLLM (rollout.mode: continuous, rollout.backend: vllm): a fixed
number of slots, each answer one vLLM request; vLLM's scheduler batches them. The engine is
VllmRollout's, its core stepped in this process one `LLMEngine.step()` at a time, so new
weights land exactly between two steps and each token records the version that sampled it.
How it steps, salts the prefix cache, takes new weights (rollout.kv_on_update), seeds, restarts
and resumes: docs/vllm.md, "Continuous generation"."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from grpo.config import Config
from grpo.rollout.base import EngineContext
from grpo.rollout.slots import Answer, SlotRequest, SlotTable
from grpo.rollout.vllm import VllmRollout
from grpo.weights.version import Version

log = logging.getLogger("grpo.vllm")

_IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def build(ctx: EngineContext) -> VllmSlotEngine | VllmRollout:
    """rollout.backend: vllm. Its own engine processes, loaded from the initial weights:
    lock-step with LLM.generate (VllmRollout), continuous with this module's slots."""
    if ctx.cfg.rollout.mode != "continuous":
        return VllmRollout(ctx.cfg, ctx.model_path, ctx.stop_event)
    return VllmSlotEngine(ctx.cfg, ctx.model_path, ctx.stop_event, ctx.stop_strings)


def request_seed(seed: int, tokens: int) -> int:
    """The vLLM seed of an answer (re-)added with `tokens` tokens already sampled."""
    return (seed * 1_000_003 + tokens) % 2**63


@contextlib.contextmanager
def _in_process_core() -> Iterator[None]:
    """vLLM's engine core in this process for the engine started inside (vLLM reads the
    variable only at a start; its in-process core caches every variable once started, so the
    cache is dropped on the way out, and a later engine in this process starts as usual)."""
    import vllm.envs

    vllm.envs.disable_envs_cache()  # an earlier engine here may have cached the variable
    before = os.environ.get(_IN_PROCESS_ENV)
    os.environ[_IN_PROCESS_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_IN_PROCESS_ENV, None)
        else:
            os.environ[_IN_PROCESS_ENV] = before
        vllm.envs.disable_envs_cache()


class VllmSlotEngine(VllmRollout, SlotTable):
    """grpo.rollout.slots.SlotEngine on VllmRollout's engine (its weight loading, then the
    answers in flight moved onto the new weights)."""

    def __init__(
        self,
        cfg: Config,
        model_path: Path,
        stop_event: threading.Event | None = None,
        stop: tuple[str, ...] = (),
    ):
        r = cfg.rollout
        SlotTable.__init__(self, r.slots or r.questions_per_step * r.group_size)
        self.stop = stop or tuple(r.stop)  # where a turn ends (EngineContext.stop_strings)
        self.version = 0
        self._requests: dict[str, int] = {}  # vLLM request id -> slot
        self._resumed: dict[int, int] = {}  # slot -> tokens it had when last re-added
        self._added = 0  # requests added so far (their ids are unique)
        self._finished: list[Answer] = []  # finished outside a step, for the next one
        self._old_adapter: int | None = None  # replaced by load, still in use
        self._tokenizer = None
        super().__init__(cfg, model_path, stop_event)

    def _start(self, model_path: Path):
        # The worker in its own process (on CPU vLLM forbids it in ours: its OpenMP setup),
        # the scheduler in ours: see the module docstring.
        self.kwargs.update(distributed_executor_backend="mp", max_num_seqs=self.slots)
        with _in_process_core():
            return super()._start(model_path)

    # ------------------------------------------------------------------ slots

    def admit(self, requests: list[SlotRequest]) -> list[Answer]:
        answers = self.seat(requests)
        for a in answers:
            self._add(a)
        return answers

    def restore(self, answers: list[Answer]) -> None:
        self.reseat(answers)
        for a in sorted(answers, key=lambda a: a.slot):
            self._add(a)

    def _restart(self, vdir: Path) -> None:
        """A new engine on `vdir`'s weights, the answers in flight re-added as a resume restores
        them (dropped, they would hold their slots for ever and the loop would spin)."""
        answers = self.in_flight()
        super()._restart(vdir)
        self.restore(answers)

    def rebuild_cache(self) -> None:
        """Nothing: see the module docstring (a vLLM resume continues, not bit for bit)."""

    # ------------------------------------------------------------------ decoding

    def step(self) -> list[Answer]:
        finished, self._finished = self._finished, []
        if self.stop_event.is_set() or not self._requests:
            return finished
        for out in self.llm.llm_engine.step():
            slot = self._requests.get(out.request_id)
            if slot is None:
                continue  # aborted by us
            a, c = self.answers[slot], out.outputs[0]
            if c.token_ids and c.logprobs is None:
                raise RuntimeError("vLLM returned tokens without their log-probs")
            for tok, lp in zip(c.token_ids, c.logprobs or (), strict=True):
                a.tokens.append(int(tok))
                a.logps.append(float(lp[tok].logprob))
                a.versions.append(self.version)
            reason = c.finish_reason if out.finished else None
            if reason is None and self._stop_across_restore(a):
                self.llm.llm_engine.abort_request([out.request_id])
                reason = "stop"
            if reason is None:
                continue
            if reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM ended an answer with finish_reason={reason!r}")
            a.finish_reason = reason
            self._release(slot)
            finished.append(a)
        return sorted(finished, key=lambda a: a.slot)

    def load(self, version: Version) -> str:
        how = super().load(version)
        self._serve_in_flight(version.number)
        return how

    def _serve_in_flight(self, version: int) -> None:
        """The answers in flight onto the weights just loaded, as rollout.kv_on_update says."""
        self.version = version
        engine = self.llm.llm_engine
        if self._old_adapter is not None:
            # Requests keep the adapter they were added with: re-add them all with the new one.
            answers = self.in_flight()
            self._abort(answers)
            engine.remove_lora(self._old_adapter)
            self._old_adapter = None
            for a in answers:
                self._add(a)
        elif self.cfg.rollout.kv_on_update == "recompute":
            if self._requests:
                engine.reset_prefix_cache(reset_running_requests=True)
        else:  # keep; the answers not started yet are prefilled by the new weights
            fresh = [a for a in self.in_flight() if not a.tokens]
            self._abort(fresh)
            for a in fresh:
                self._add(a)

    def close(self) -> None:
        self.answers = [None] * self.slots
        self._requests.clear()
        super().close()

    # ------------------------------------------------------------------ internals

    def _add(self, a: Answer) -> None:
        """Add answer `a` to the engine: its prompt and tokens so far as the prompt, its
        remaining budget as max_tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        left = a.request.max_new_tokens - len(a.tokens)
        if left <= 0:
            a.finish_reason = "length"
            self.release(a.slot)
            self._finished.append(a)
            return
        r = self.cfg.rollout
        params = SamplingParams(
            n=1,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=left,
            stop=list(self.stop) or None,
            logprobs=0,  # the sampled token's log-prob only
            seed=request_seed(a.request.seed, len(a.tokens)),
            output_kind=RequestOutputKind.DELTA,
        )
        prompt = TokensPrompt(
            prompt_token_ids=[int(t) for t in a.request.prompt_ids] + a.tokens,
            cache_salt=f"v{self.version}",
        )
        request_id = f"{a.request.uid}-{self._added}"
        self._added += 1
        self.llm.llm_engine.add_request(request_id, prompt, params, lora_request=self.lora_request)
        self._requests[request_id] = a.slot
        if a.tokens:
            self._resumed[a.slot] = len(a.tokens)
        else:
            self._resumed.pop(a.slot, None)

    def _abort(self, answers: list[Answer]) -> None:
        slots = {a.slot for a in answers}
        ids = [rid for rid, slot in self._requests.items() if slot in slots]
        if ids:
            self.llm.llm_engine.abort_request(ids)
        for rid in ids:
            del self._requests[rid]

    def _release(self, slot: int) -> None:
        self.release(slot)
        self._resumed.pop(slot, None)
        for rid in [rid for rid, s in self._requests.items() if s == slot]:
            del self._requests[rid]

    def _stop_across_restore(self, a: Answer) -> bool:
        """Whether a re-added answer's text now holds a stop string that vLLM cannot see: one
        that begins in the tokens it was re-added with. Checked only while it can be (a stop
        string's tokens are no more than its characters), on the answer's whole text."""
        stops = self.stop
        base = self._resumed.get(a.slot)
        if not stops or base is None:
            return False
        if len(a.tokens) - base > max(len(s) for s in stops):
            self._resumed.pop(a.slot, None)
            return False
        if self._tokenizer is None:
            self._tokenizer = self.llm.get_tokenizer()
        text = self._tokenizer.decode(a.tokens)
        before = self._tokenizer.decode(a.tokens[:base])
        return any(s in text and s not in before for s in stops)

    def _use_adapter(self, vdir: Path, version: int) -> str:
        """As VllmRollout's, but the old adapter stays loaded until _serve_in_flight has
        moved the answers in flight off it."""
        previous = self.lora_request
        self.lora_request = None  # the base class removes nothing when it finds none
        how = super()._use_adapter(vdir, version)
        if previous is not None and self._old_adapter is None:
            self._old_adapter = previous.lora_int_id
        elif previous is not None:  # an adapter loaded since the last update: unused
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        return how
