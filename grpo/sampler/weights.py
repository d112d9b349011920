"""The sampler's weights: which published version it samples with, loaded into its HF policy
and its rollout engine, and the wait for the version a batch may be sampled with."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from grpo.config import Config
from grpo.config.weights import streams_versions, weights_mode
from grpo.core.versions import verify_version, version_dir
from grpo.delivery.sampler_endpoint import SamplerEndpoint
from grpo.models.loading import adapter_state, apply_lora, copy_state, load_causal_lm
from grpo.rollout.base import RolloutEngine
from grpo.runtime.placement import sampler_memory_fraction
from grpo.runtime.progress import ACTIVITY, RECEIVING
from grpo.weights.collective.member import GroupMember
from grpo.weights.dirs import is_adapter, load_state_dict
from grpo.weights.stream.follower import VersionFollower
from grpo.weights.stream.torch_bits import image_from_state, state_from_image
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
        self.engine: RolloutEngine | None = None
        self.endpoint: SamplerEndpoint | None = None
        self.version = 0
        self.reload_s = 0.0
        # Versions that could not be loaded (fetch failed, files failed their checksums), and why.
        self.failed_reloads: dict[int, str] = {}
        self.follower: VersionFollower | None = None  # weights.mode: stream, collective
        self.member: GroupMember | None = None  # weights.mode: collective
        self._targets: dict[str, torch.Tensor] | None = None  # the policy's tensors, to load into

    def hf_policy(self) -> torch.nn.Module:
        """The HF policy (loaded on first use), which the sampler keeps at its version."""
        if self.policy is None:
            cfg = self.cfg
            attn = cfg.model.attn_implementation
            policy = load_causal_lm(self.model_path, cfg.model.dtype, attn).eval()
            if cfg.model.lora.enabled:
                policy = apply_lora(policy, cfg.model.lora).eval()
            self.policy = policy.to(self.device)
        return self.policy

    def connect(self, endpoint: SamplerEndpoint, engine: RolloutEngine) -> None:
        """From now on, wait for versions from `endpoint`'s trainer (fetched over the channel
        in weights.mode files, received from memory in stream) and load them into `engine`."""
        self.endpoint, self.engine = endpoint, engine
        if streams_versions(self.cfg):
            status, channel = endpoint.status, endpoint.channel
            several, lora = self.cfg.rollout.num_samplers > 1, self.cfg.model.lora.enabled
            seed = None  # version 0, the first delta's base (without an HF policy: full copies)
            if self.policy is not None:
                seed = image_from_state(0, self.policy_tensors(lora), 1 << 26, lora)
            self.follower = VersionFollower(
                self.cfg,
                channel.ctx,
                endpoint.sampler_id,
                channel.keys,
                relays=lambda: status.relays,
                announced=(lambda: status.version) if several else None,
                seed=seed,
                trusted=lambda: status.manifests,
            )
            channel.relay_address = self.follower.address
            endpoint.before_close.append(self.follower.close)
            if weights_mode(self.cfg) == "collective":
                follower = self.follower
                self.member = GroupMember(self.cfg, endpoint.sampler_id, lambda: status.group,
                                          follower.offer)  # fmt: skip
                follower.expected = self.member.expects
                channel.collective_state = lambda: self.member.state
                endpoint.before_close.insert(0, self.member.close)

    def reload(self, version: int) -> None:
        """Load published version `version` into the HF policy and the engine (if any).

        A version whose files fail their checksums (or are gone) is not loaded: the sampler
        keeps its current weights, says why, and tries again at the next announced version."""
        if self.follower is not None:
            self.receive(version)
            return
        vdir = version_dir(self.run_dir, version)
        try:
            if self.endpoint is not None and self.endpoint.weights is not None:
                self.endpoint.weights.fetch(self.run_dir, version, self.cfg.train.keep_versions)
            verify_version(vdir)
        except ValueError as e:
            self.failed_reloads[version] = str(e)
            log.warning("keeping version %d, not loading version %d: %s", self.version, version, e)
            return
        t0 = time.monotonic()
        if self.policy is not None:
            self.load_into_policy(vdir)
        if self.engine is not None:
            self.engine.load_version(vdir, version)
        self.reload_s = time.monotonic() - t0
        log.info(
            "reloaded weights: version %d -> %d in %.1f s", self.version, version, self.reload_s
        )
        self.version = version

    def receive(self, version: int) -> None:
        """weights.mode: stream: wait for the follower to hold `version` (checked whole), then
        load it. Failing that, keep the current weights as reload does."""
        assert self.follower is not None and self.endpoint is not None
        follower, image = self.follower, None
        follower.want(version)
        with ACTIVITY.during(RECEIVING, f"version {version}"):
            seen = self._buckets_received()

            def arrived() -> bool:
                nonlocal image, seen
                if self._buckets_received() != seen:
                    seen = self._buckets_received()
                    ACTIVITY.tick()  # buckets coming in: a transfer that stops is a stall
                try:
                    image = follower.image(version)
                except ValueError as e:
                    self.failed_reloads[version] = str(e)
                    return True
                return image is not None

            self.endpoint.wait_until(arrived, f"version {version}", own_phase=True)
        if image is None:
            if version in self.failed_reloads:
                log.warning("keeping version %d, not loading version %d: %s",
                            self.version, version, self.failed_reloads[version])  # fmt: skip
            return
        t0 = time.monotonic()
        state = state_from_image(image)
        if self.policy is not None:
            self.load_state(state, image.manifest.adapter, f"version {image.version}")
        if self.engine is not None:
            self.engine.load_tensors(state, image.version)
        self.reload_s = time.monotonic() - t0
        log.info("loaded weights: version %d -> %d in %.2f s (streamed)",
                 self.version, image.version, self.reload_s)  # fmt: skip
        self.version = image.version

    def _buckets_received(self) -> int:
        assert self.follower is not None
        by_group = self.member.progress if self.member is not None else 0
        return self.follower.receiver.stats.progress + by_group

    def stream_stats(self) -> dict[str, float]:
        """weights.mode: stream, collective: bytes received (streamed, broadcast) and
        fallbacks, totals so far (else nothing)."""
        if self.follower is None:
            return {}
        stats = self.follower.receiver.stats
        by_group = (
            {"weights_broadcast_mb": self.member.received_bytes / 2**20} if self.member else {}
        )
        return {
            "weights_received_mb": stats.bytes / 2**20,
            "weights_fallbacks": float(sum(stats.fallbacks.values())),
            **by_group,
        }

    def load_into_policy(self, vdir: Path) -> None:
        self.load_state(load_state_dict(vdir), is_adapter(vdir), str(vdir))

    def policy_tensors(self, adapter: bool) -> dict[str, torch.Tensor]:
        """The HF policy's tensors (the adapter's alone with LoRA) by their published names,
        sharing its memory: found once, loaded into at every version."""
        if self._targets is None:
            policy = self.hf_policy()
            self._targets = adapter_state(policy) if adapter else policy.state_dict()
        return self._targets

    def load_state(self, state: dict[str, torch.Tensor], adapter: bool, what: str) -> None:
        """Full weights or a LoRA adapter's into the HF policy, copied into its tensors in
        place, all or nothing (a mismatch is refused before any copy)."""
        assert self.policy is not None
        tied = set(getattr(self.policy, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
        copy_state(self.policy_tensors(adapter), state, set() if adapter else tied, what)

    def wait_for_version(self, needed: Callable[[], int]) -> None:
        """Wait until the trainer published `needed()` (the staleness bound, which moves as
        samplers come and go), then load it.

        A lone sampler loads exactly that version, even when a newer one is out (which version
        samples a batch never depends on timing: a run with overlap repeats exactly); several
        samplers load the newest (the trainer is further ahead of each of them).
        Either may be older than the one this sampler had, after a trainer restart."""
        endpoint = self.endpoint
        assert endpoint is not None
        status = endpoint.status
        while True:
            endpoint.wait_until(lambda: status.version >= needed(), "a newer version")
            oldest = needed()
            target = oldest if self.cfg.rollout.num_samplers == 1 else status.version
            if endpoint.stopped.is_set():
                return
            if target != self.version and target not in self.failed_reloads:
                self.reload(target)
            if target in self.failed_reloads and status.version < target:
                del self.failed_reloads[target]
                if self.follower is not None:
                    self.follower.forget_failure(target)
                continue  # the trainer restarted older meanwhile: it will publish it again
            break
        # Weights older than the bound would make a batch the trainer trains as if it were
        # fresher: a stall with its name, never a silent run on old weights.
        if target in self.failed_reloads and self.version < oldest:
            raise PeerError(
                f"cannot sample the next batch: it needs version {oldest} or newer, this "
                f"sampler has version {self.version}, and version {target} could not be "
                f"loaded: {self.failed_reloads[target]}"
            )
