"""The sampler's last mile: which published version it serves, received the way weights.mode
says (grpo.weights.modes) and loaded into everything that samples or scores with it (the HF
policy, the rollout engine), under the staleness bound the pacing gives."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from grpo.config import Config
from grpo.models.loading import copy_state
from grpo.models.shared_policy import SharedPolicy
from grpo.weights.modes import mode_of
from grpo.weights.modes.base import Receiver, SamplerLink, Unavailable
from grpo.weights.stream.image import Image
from grpo.weights.stream.torch_bits import LoadPlan, image_from_state
from grpo.weights.version import Version
from grpo.wire.channels import PeerError

log = logging.getLogger("grpo.sampler")


class Consumer(Protocol):
    """What samples or scores with the weights: it takes each version whole."""

    def load(self, version: Version) -> None: ...


class Announced(Protocol):
    version: int  # the newest the trainer announced
    restarts: int  # trainer incarnations seen after the first


class TrainerWord(Protocol):
    """What the sampler's endpoint knows of the trainer (grpo.delivery.sampler_endpoint)."""

    status: Announced
    stopped: threading.Event

    def wait_until(self, ready: Callable[[], bool], what: str) -> None: ...


class PolicyCopy:
    """A Consumer: the shared HF policy, once loaded, kept at each version. A version in memory
    goes in with one copy per bucket (its plan made once for the versions of this model), one
    from a dir tensor by tensor."""

    def __init__(self, policy: SharedPolicy):
        self.policy = policy
        self._plan: LoadPlan | None = None

    def load(self, version: Version) -> None:
        if not self.policy.loaded:  # nothing samples or scores with it
            return
        targets = self.policy.tensors(version.adapter)
        tied = self.policy.tied(version.adapter)
        image = version.image
        if image is None:  # all or nothing: a mismatch is refused before any copy
            copy_state(targets, version.tensors(), tied, str(version))
            return
        if self._plan is None or not self._plan.fits(image.manifest):
            self._plan = LoadPlan(targets, image.manifest, tied, str(version))
        self._plan.load(image)

    def seed(self, from_memory: bool) -> Image | None:
        """Version 0 as the sampler holds it, the first delta's base (None: full copies)."""
        if not (from_memory and self.policy.loaded):
            return None
        lora = self.policy.cfg.model.lora.enabled
        return image_from_state(0, self.policy.tensors(lora), 1 << 26, lora)


class WeightsInUse:
    """The version the sampler serves (0: the initial weights), and how it came to be.

    A version that cannot be had whole (its files fail their checksums or are gone, its bytes
    fail the trainer's manifest) is not loaded: the sampler keeps its weights, says why in
    `failed_reloads`, and tries again at the next announced version."""

    def __init__(self, cfg: Config, policy: SharedPolicy):
        self.cfg = cfg
        self.mode = mode_of(cfg)
        self.policy = PolicyCopy(policy)
        self.consumers: list[Consumer] = [self.policy]
        self.version = 0
        self.reload_s = 0.0
        self.failed_reloads: dict[int, str] = {}  # version -> why it could not be loaded
        self.failed_under: dict[int, int] = {}  # version -> trainer restarts seen then
        self.receiver: Receiver | None = None  # the mode's, once connected
        self.trainer: TrainerWord | None = None

    def seed(self) -> Image | None:
        return self.policy.seed(self.mode.from_memory)

    def connect(self, link: SamplerLink, trainer: TrainerWord, engine: Consumer | None) -> Receiver:
        """From now on, receive versions through `link` as the trainer announces them, and
        load them into `engine` too. The mode's receiver, for the endpoint to close."""
        self.trainer = trainer
        self.receiver = self.mode.receiver(self.cfg, link)
        if engine is not None:
            self.consumers.append(engine)
        return self.receiver

    def serve(self, needed: Callable[[], int]) -> int:
        """Wait until the trainer published `needed()` (the staleness bound, which moves as
        samplers come and go), load it, and return the version now served.

        A lone sampler loads exactly that version, even when a newer one is out (which version
        samples a batch never depends on timing: a run with overlap repeats exactly); several
        samplers load the newest (the trainer is further ahead of each of them).
        Either may be older than the one this sampler had, after a trainer restart."""
        trainer = self.trainer
        assert trainer is not None
        while True:
            oldest, target = self._load_needed(needed)
            if trainer.stopped.is_set() or target not in self.failed_reloads:
                return self.version
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
        return self.version

    def reload(self, number: int) -> None:
        """Load published version `number` into every consumer, or keep the weights in use and
        record why not."""
        assert self.receiver is not None
        try:
            version = self.receiver.get(number)
        except Unavailable as e:
            self.failed_reloads[number] = str(e)
            self.failed_under[number] = self.trainer.status.restarts if self.trainer else 0
            log.warning("keeping version %d, not loading version %d: %s", self.version, number, e)
            return
        if version is None:  # the sampler is stopping
            return
        t0 = time.monotonic()
        for consumer in self.consumers:
            consumer.load(version)
        self.reload_s = time.monotonic() - t0
        # With relays a receiver may hand over a newer version than asked for: the one loaded.
        if version.vdir is not None:
            said = "reloaded weights: version %d -> %d in %.1f s"
        else:
            said = "loaded weights: version %d -> %d in %.2f s (streamed)"
        log.info(said, self.version, version.number, self.reload_s)
        self.version = version.number

    def stats(self) -> dict[str, float]:
        """Bytes received (streamed, broadcast) and fallbacks, totals so far (weights.mode
        stream, collective; else nothing)."""
        return self.receiver.stats() if self.receiver is not None else {}

    def _load_needed(self, needed: Callable[[], int]) -> tuple[int, int]:
        """Wait for `needed()` and load it, or the newest (see serve); (the oldest version
        allowed, the one loaded or failed)."""
        trainer = self.trainer
        assert trainer is not None
        status = trainer.status
        trainer.wait_until(lambda: status.version >= needed(), "a newer version")
        oldest = needed()
        target = oldest if self.cfg.rollout.num_samplers == 1 else status.version
        stopped = trainer.stopped.is_set()
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
        trainer = self.trainer
        assert trainer is not None
        status, restarts = trainer.status, self.failed_under.get(target)

        def restarted() -> bool:
            return status.restarts != restarts or status.version < target

        if grace_s > 0 and not restarted():
            deadline = time.monotonic() + grace_s
            what = f"the trainer's word after version {target} failed"
            trainer.wait_until(lambda: restarted() or time.monotonic() > deadline, what)
        return restarted()
