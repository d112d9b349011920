"""eval.engine: sampler, the trainer's side of the protocol: which version's evaluation answers
it waits for (every heartbeat asks, once a batch has vouched for a sampler), and which answers
it takes: only for that version, evaluated on this trainer process's weights, from the process
heard under the sampler's id. What the answers hold grpo.eval.from_sampler checks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from grpo.runtime.refusals import note

log = logging.getLogger("grpo.trainer")


class AnswersAsked:
    def __init__(self, is_from: Callable[[str, object], bool]):
        """`is_from(sid, incarnation)`: whether a message is from the process heard under
        `sid` (grpo.delivery.pool)."""
        self.is_from = is_from
        self.version: int | None = None  # the version whose answers are waited for
        self.answers: Any = None  # ... once they came
        self.refused = 0  # answers not asked for, counted

    def ask(self, version: int | None) -> None:
        """Wait for `version`'s answers from now on (None: for none)."""
        self.version, self.answers = version, None

    def wait(self, version: int, receive: Callable[[], None], changed: Callable[[], None]) -> Any:
        """Ask for `version`'s answers and `receive()` until they came; `changed()` after each
        change of what the heartbeats say."""
        self.ask(version)
        changed()
        try:
            while self.answers is None:
                receive()
            return self.answers
        finally:
            self.ask(None)
            changed()

    def status(self, vouched: bool) -> dict[str, Any]:
        """What the heartbeats say: the version asked for, of a sampler `vouched` for only (its
        first batch first, or a long first evaluation would run out the startup timeout,
        which answers do not stop)."""
        return {"evaluate": self.version} if self.version is not None and vouched else {}

    def take(self, body: dict[str, Any], trainer: str) -> bool:
        """A sampler's answers: whether they are the ones asked for (then in `answers`) of
        this trainer process (its incarnation `trainer`)."""
        sid, version = body.get("sampler_id"), body.get("version")
        why = None
        if self.version is None or version != self.version:
            why = f"answers for version {str(version)[:20]}, not asked for"
        elif body.get("trainer") != trainer:
            why = f"answers for version {version} of another trainer process"
        elif not (isinstance(sid, str) and self.is_from(sid, body.get("incarnation"))):
            why = f"answers in the name of {str(sid)[:80]!r} from a process not heard under it"
        if why is not None:
            self.refused += 1
            note(log, self.refused, "ignored evaluation answers (%d so far): %s", self.refused, why)
            return False
        self.answers = body.get("answers")
        return True
