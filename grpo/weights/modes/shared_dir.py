"""weights.mode shared_dir: the samplers read the trainer's version dirs from a filesystem they
share with it; the trainer serves nothing."""

from __future__ import annotations

from pathlib import Path

from grpo.config import Config
from grpo.weights.dirs import verify_version, version_dir
from grpo.weights.modes.base import Mode, Receiver, SamplerLink, TrainerEnd, Unavailable
from grpo.weights.version import Version


class DirReceiver(Receiver):
    """A version dir of the run, used only when every file checks out against its
    version.json."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def get(self, number: int) -> Version:
        vdir = version_dir(self.run_dir, number)
        try:
            verify_version(vdir)
        except ValueError as e:
            raise Unavailable(str(e)) from None
        return Version.from_dir(vdir, number)


def reader(cfg: Config, link: SamplerLink) -> DirReceiver:
    return DirReceiver(link.run_dir)


MODE = Mode("shared_dir", from_memory=False, trainer_end=TrainerEnd, receiver=reader)
