"""The names peers give themselves, bounded. A sampler id is repeated in every trainer control
message (its relay, its acknowledgements), in log lines, metrics rows and the spool's path: an
unbounded one from a peer could swell every control message past transport.max_frame_bytes
(issue 43), or step out of the spool's directory."""

from __future__ import annotations

import re

SAMPLER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SAMPLER_ID_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"


def is_sampler_id(value: object) -> bool:
    return isinstance(value, str) and SAMPLER_ID.fullmatch(value) is not None
