"""The sampler's weights: which published version it samples with, loaded into its HF policy
and its rollout engine, and the wait for the version a batch may be sampled with."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from grpo.config import Config
from grpo.delivery.sampler_endpoint import SamplerEndpoint
from grpo.models.loading import (
    adapter_state,
    apply_lora,
    copy_state,
    load_causal_lm,
    pack_adapter,
)
from grpo.rollout.slots import SlotEngine
from grpo.runtime.placement import sampler_memory_fraction
from grpo.weights.modes import mode_of
from grpo.weights.modes.base import Receiver, SamplerLink, Unavailable
from grpo.weights.stream.torch_bits import LoadPlan, image_from_state
from grpo.weights.version import Version
from grpo.wire.channels import PeerError

log = logging.getLogger("grpo.sampler")


def expected_batch(trained: dict[str, int], sampler_id: str, made: int, alive: int) -> int:
    """Which batch of the run (counted from 0) the one this sampler makes next is expected to
    be, from the trainer's last heartbeat: all batches trained so far, then this sampler's
    `made - trained[sampler_id]` still on their way, with one from each other live sampler
    between two of ours. A lone sampler's is exactly `made`. With none of its own on the way
    it is the trainer's next, so a sampler never waits for a version only its own batch could
    bring, whichever samplers died."""
    on_the_way = max(made - trained.get(sampler_id, 0), 0)
    return sum(trained.values()) + on_the_way * max(alive, 1)


def hf_device(cfg: Config) -> str:
    """Where the sampler's HF models go; on a GPU shared with the trainer, their memory is
    capped."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and (cap := sampler_memory_fraction(cfg)):
        # Sharing the GPU with the trainer: past the cap our allocations fail here,
        # with a message, instead of the trainer running out of memory mid-step.
        torch.cuda.set_per_process_memory_fraction(cap)
        log.info("sampler: HF models capped at %.0f%% of the GPU's memory", 100 * cap)
    return device


def receiving_wait(endpoint: SamplerEndpoint) -> Callable[[Callable[[], bool], str], None]:
    """How a receiver waits for a version: in the sampler's own `receiving weights` phase,
    which the receiver ticks as buckets come in (a transfer that stops is a stall with its
    name), never the idle `waiting` that no stall limit watches."""
    return lambda ready, what: endpoint.wait_until(ready, what, own_phase=True)


class Weights:
    """The version the sampler has (0: the initial weights), in the HF policy and the engine.

    The HF policy is loaded on first use: to score the answers (train.logprobs_on: sampler) and
    for an engine that samples with it. vLLM with trainer-side scoring needs none."""

    def __init__(self, cfg: Config, model_path: Path):
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.model_path = model_path
        self.device = hf_device(cfg)
        self.policy: torch.nn.Module | None = None
        self.engine: SlotEngine | None = None
        self.endpoint: SamplerEndpoint | None = None
        self.version = 0
        self.reload_s = 0.0
        # Versions that could not be loaded (fetch failed, files failed their checksums), and why.
        self.failed_reloads: dict[int, str] = {}
        self.failed_under: dict[int, int] = {}  # version -> trainer restarts seen when it failed
        self.mode = mode_of(cfg)
        self.receiver: Receiver | None = None  # the mode's, once connected
        self._targets: dict[str, torch.Tensor] | None = None  # the policy's tensors, to load into
        self._plan: LoadPlan | None = None  # where a version in memory goes in them

    def hf_policy(self) -> torch.nn.Module:
        """The HF policy (loaded on first use), which the sampler keeps at its version."""
        if self.policy is None:
            cfg = self.cfg
            attn = cfg.model.attn_implementation
            policy = load_causal_lm(self.model_path, cfg.model.dtype, attn).eval()
            if cfg.model.lora.enabled:
                policy = apply_lora(policy, cfg.model.lora).eval()
            self.policy = policy.to(self.device)
            if cfg.model.lora.enabled:
                pack_adapter(self.policy)  # each version of it loaded with one copy
        return self.policy

    def connect(self, endpoint: SamplerEndpoint, engine: SlotEngine) -> None:
        """From now on, wait for versions from `endpoint`'s trainer, received the way
        weights.mode says (grpo.weights.modes), and load them into `engine`."""
        self.endpoint, self.engine = endpoint, engine
        status, channel = endpoint.status, endpoint.channel
        lora = self.cfg.model.lora.enabled
        seed = None  # version 0, the first delta's base (without an HF policy: full copies)
        if self.policy is not None and self.mode.from_memory:
            seed = image_from_state(0, self.policy_tensors(lora), 1 << 26, lora)
        link = SamplerLink(
            run_dir=self.run_dir,
            sampler_id=endpoint.sampler_id,
            ctx=channel.ctx,
            keys=channel.keys,
            limits=channel.limits,
            secure=channel.secure,
            announced=lambda: status.version,
            relays=lambda: status.relays,
            manifests=lambda: status.manifests,
            group=lambda: status.group,
            wait=receiving_wait(endpoint),
            wake=endpoint.wake,
            seed=seed,
        )
        self.receiver = receiver = self.mode.receiver(self.cfg, link)
        endpoint.before_close.append(receiver.close)  # before the channel's context ends
        channel.relay_address = receiver.relay_address
        if receiver.collective_state() is not None:
            channel.collective_state = receiver.collective_state

    def reload(self, number: int) -> None:
        """Load published version `number` into the HF policy and the engine (if any).

        A version that cannot be had whole (its files fail their checksums or are gone, its
        bytes fail the trainer's manifest) is not loaded: the sampler keeps its current
        weights, says why, and tries again at the next announced version."""
        assert self.receiver is not None
        try:
            version = self.receiver.get(number)
        except Unavailable as e:
            self.failed_reloads[number] = str(e)
            self.failed_under[number] = self.endpoint.status.restarts if self.endpoint else 0
            log.warning("keeping version %d, not loading version %d: %s", self.version, number, e)
            return
        if version is None:  # the sampler is stopping
            return
        t0 = time.monotonic()
        if self.policy is not None:
            self.load_into_policy(version)
        if self.engine is not None:
            self.engine.load(version)
        self.reload_s = time.monotonic() - t0
        # With relays a receiver may hand over a newer version than asked for: the one loaded.
        if version.vdir is not None:
            log.info("reloaded weights: version %d -> %d in %.1f s",
                     self.version, version.number, self.reload_s)  # fmt: skip
        else:
            log.info("loaded weights: version %d -> %d in %.2f s (streamed)",
                     self.version, version.number, self.reload_s)  # fmt: skip
        self.version = version.number

    def stream_stats(self) -> dict[str, float]:
        """Bytes received (streamed, broadcast) and fallbacks, totals so far (weights.mode
        stream, collective; else nothing)."""
        return self.receiver.stats() if self.receiver is not None else {}

    def load_into_policy(self, version: Version) -> None:
        """`version` into the HF policy (also the evaluation CLI's, with no trainer): one copy
        per bucket for a version in memory (its plan made once for the versions of this
        model), else tensor by tensor."""
        image, targets = version.image, self.policy_tensors(version.adapter)
        tied = self._tied(version.adapter)
        if image is None:  # all or nothing: a mismatch is refused before any copy
            copy_state(targets, version.tensors(), tied, str(version))
            return
        if self._plan is None or not self._plan.fits(image.manifest):
            self._plan = LoadPlan(targets, image.manifest, tied, str(version))
        self._plan.load(image)

    def policy_tensors(self, adapter: bool) -> dict[str, torch.Tensor]:
        """The HF policy's tensors (the adapter's alone with LoRA) by their published names,
        sharing its memory: found once, loaded into at every version."""
        if self._targets is None:
            policy = self.hf_policy()
            self._targets = adapter_state(policy) if adapter else policy.state_dict()
        return self._targets

    def _tied(self, adapter: bool) -> set[str]:
        """The policy's tensors a version may leave out: those sharing another's memory."""
        assert self.policy is not None
        if adapter:
            return set()
        return set(getattr(self.policy, "_tied_weights_keys", None) or []) | {"lm_head.weight"}

    def wait_for_version(self, needed: Callable[[], int]) -> None:
        """Wait until the trainer published `needed()` (the staleness bound, which moves as
        samplers come and go), then load it.

        A lone sampler loads exactly that version, even when a newer one is out (which version
        samples a batch never depends on timing: a run with overlap repeats exactly); several
        samplers load the newest (the trainer is further ahead of each of them).
        Either may be older than the one this sampler had, after a trainer restart."""
        endpoint = self.endpoint
        assert endpoint is not None
        while True:
            oldest, target = self._load_needed(needed)
            if endpoint.stopped.is_set() or target not in self.failed_reloads:
                return
            # Within the bound the sampler samples on; below it, it gives the trainer two
            # heartbeats to say it restarted before it calls the failure a stall.
            grace = 0.0 if self.version >= oldest else 2 * self.cfg.transport.heartbeat_s
            if not self._trainer_restarts(target, grace):
                break
            self._forget_failure(target)
        # Weights older than the bound would make a batch the trainer trains as if it were
        # fresher: a stall with its name, never a silent run on old weights.
        if self.version < oldest:
            raise PeerError(
                f"cannot sample the next batch: it needs version {oldest} or newer, this "
                f"sampler has version {self.version}, and version {target} could not be "
                f"loaded: {self.failed_reloads[target]}"
            )

    def _load_needed(self, needed: Callable[[], int]) -> tuple[int, int]:
        """Wait for `needed()` and load it, or the newest (see wait_for_version); (the oldest
        version allowed, the one loaded or failed)."""
        endpoint = self.endpoint
        assert endpoint is not None
        status = endpoint.status
        endpoint.wait_until(lambda: status.version >= needed(), "a newer version")
        oldest = needed()
        target = oldest if self.cfg.rollout.num_samplers == 1 else status.version
        stopped = endpoint.stopped.is_set()
        if not stopped and target != self.version and target not in self.failed_reloads:
            self.reload(target)
        return oldest, target

    def _forget_failure(self, target: int) -> None:
        del self.failed_reloads[target]
        assert self.receiver is not None
        self.receiver.forget_failure(target)

    def _trainer_restarts(self, target: int, grace_s: float) -> bool:
        """Whether the trainer restarted since `target` failed (a new incarnation, or one that
        announces an older version: it resumed from an older state), as its heartbeats say by
        now or within `grace_s`: it will publish `target` again, and the failure says nothing
        of the new incarnation's. A failure only just before the restart is heard ("it has no
        version 3", asked of the trainer coming back) is no stall: a chaos run stopped so, one
        time in a CI run."""
        endpoint = self.endpoint
        assert endpoint is not None
        status, restarts = endpoint.status, self.failed_under.get(target)

        def restarted() -> bool:
            return status.restarts != restarts or status.version < target

        if grace_s > 0 and not restarted():
            deadline = time.monotonic() + grace_s
            endpoint.wait_until(lambda: restarted() or time.monotonic() > deadline,
                                f"the trainer's word after version {target} failed")  # fmt: skip
        return restarted()
