"""The registry of weights modes: how versions travel, by weights.mode (auto resolved by
grpo.config.weights.weights_mode). Adding a mode: a module defining a `Mode` (its trainer end
and its receiver, grpo.weights.modes.base), and its line here."""

from __future__ import annotations

from grpo.config import Config
from grpo.config.weights import weights_mode
from grpo.weights.modes import collective, files, shared_dir, stream
from grpo.weights.modes.base import Mode

MODES: dict[str, Mode] = {
    m.name: m for m in (shared_dir.MODE, files.MODE, stream.MODE, collective.MODE)
}


def mode_of(cfg: Config) -> Mode:
    return MODES[weights_mode(cfg)]
