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

MAX_STATE_CHARS = 32  # a sampler's state in the group, as its heartbeat may say it


class BroadcastingServer(MemoryServer):
    broadcaster: Broadcaster | None = None

    def start(self, link: TrainerLink) -> None:
        """The stream server, and the broadcaster, its group's membership read from the
        samplers' heartbeats (their state in the group) and announced in the trainer's."""
        super().start(link)
        assert self.store is not None

        def member_states() -> dict[str, tuple[str, str]]:
            """Each vouched sampler's (incarnation, state in the group), where it said one."""
            return {
                sid: (m.incarnation, state)
                for sid, m in link.members().items()
                if (state := m.body.get("collective")) and len(state) <= MAX_STATE_CHARS
            }

        self.broadcaster = Broadcaster(
            self.cfg, self.store, member_states, published=link.published
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
        self.group: Any = None  # as the trainer said it; GroupInfo.from_json checks it
        self.member = GroupMember(cfg, link.sampler_id, lambda: self.group, self.follower.offer)
        self.follower.expected = self.member.expects

    def heard(self, body: dict[str, Any], restarted: bool) -> None:
        super().heard(body, restarted)
        if "collective" in body:
            self.group = body["collective"]

    def announced(self) -> dict[str, str]:
        return {**super().announced(), "collective": self.member.state}

    def progress(self) -> int:
        return super().progress() + self.member.progress

    def stats(self) -> dict[str, float]:
        return {**super().stats(), "weights_broadcast_mb": self.member.received_bytes / 2**20}

    def close(self) -> None:
        super().close()  # the follower first, as the group's offers go to it
        self.member.close()


MODE = Mode("collective", from_memory=True, trainer_end=BroadcastingServer, receiver=MemberReceiver)
