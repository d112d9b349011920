"""weights.mode collective: stream's trainer end and receiver, and beside them a process group
of their own (torch.distributed) in which rank 0 broadcasts each version to the samplers
(grpo.weights.collective); a sampler takes by stream what the group could not bring it."""

from __future__ import annotations

from typing import Any

from grpo.config import Config
from grpo.weights.collective.broadcaster import Broadcaster
from grpo.weights.collective.member import GroupMember
from grpo.weights.modes.base import Mode, SamplerLink, TrainerLink
from grpo.weights.modes.stream import MemoryServer, StreamReceiver


class BroadcastingServer(MemoryServer):
    broadcaster: Broadcaster | None = None

    def start(self, link: TrainerLink) -> None:
        """The stream server, and the broadcaster, its group's membership read from the
        samplers' heartbeats (`link.member_states`) and announced in the trainer's."""
        super().start(link)
        assert self.store is not None
        self.broadcaster = Broadcaster(
            self.cfg, self.store, link.member_states, published=link.published
        )

    def published(self, version: int) -> None:
        assert self.broadcaster is not None
        self.broadcaster.publish(version)  # on its own thread: training goes on

    def announced(self) -> dict[str, Any]:
        group = self.broadcaster.announced if self.broadcaster is not None else None
        return {**super().announced(), "collective": group}

    def close(self) -> None:
        if self.broadcaster is not None:
            self.broadcaster.close()
        super().close()


class MemberReceiver(StreamReceiver):
    def __init__(self, cfg: Config, link: SamplerLink):
        super().__init__(cfg, link)
        self.member = GroupMember(cfg, link.sampler_id, link.group, self.follower.offer)
        self.follower.expected = self.member.expects

    def collective_state(self) -> str | None:
        return self.member.state

    def progress(self) -> int:
        return super().progress() + self.member.progress

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "weights_broadcast_mb": self.member.received_bytes / 2**20}

    def close(self) -> None:
        super().close()  # the follower first, as the group's offers go to it
        self.member.close()


MODE = Mode("collective", from_memory=True, trainer_end=BroadcastingServer, receiver=MemberReceiver)
