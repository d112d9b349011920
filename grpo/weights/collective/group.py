"""The process group weights.mode collective broadcasts versions over, and what travels on it.

Trainer rank 0 is rank 0 of a group of its own with the samplers it invited (ranks 1..n in the
order it named them), made by torch.distributed over gloo: never the trainer's DeepSpeed
group, which only its ranks share. The group meets at a TCPStore the trainer hosts on
weights.collective_addr; each new membership is a new generation with keys of its own there.
Every operation is bounded by weights.collective_timeout_s: a member that dies fails the others'
next operation at once, one that stalls fails it when the bound passes, and nobody waits
longer.

Each message opens with a header of HEADER_LEN int64s from the trainer (a version follows,
or nothing: a keepalive, or "move to the next generation"), then, for a version, its manifest
(msgpack, as the stream mode's) and each bucket's tensors, back to back, as one uint8
broadcast. A gloo send completes only once its receiver takes it, so every message, a
keepalive included, tells the trainer that each member is still there.
"""

from __future__ import annotations

import datetime
import re
import socket
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from grpo.config.weights import host_port

HEADER_LEN = 4  # kind, then up to three int64 values
KEEPALIVE = 1  # [KEEPALIVE, first, 0, 0]: nothing to receive; versions >= first will come
VERSION = 2  # [VERSION, version, manifest bytes, 0]: the manifest and the buckets follow
REFORM = 3  # [REFORM, generation, 0, 0]: this group ends; its members join that generation
MAX_MANIFEST_BYTES = 64 << 20


def meeting_point(addr: str, host: bool, timeout_s: float) -> dist.TCPStore:
    """The TCPStore at `addr`: served here (the trainer) or connected to (a sampler)."""
    hostname, port = host_port(addr)
    timeout = datetime.timedelta(seconds=timeout_s)
    if host:
        return dist.TCPStore(hostname, port, None, True, timeout=timeout, wait_for_workers=False)
    return dist.TCPStore(hostname, port, None, False, timeout=timeout)


def local_interface(addr: str) -> str:
    """This host's address on the route to `addr`'s host: the one the group's connections
    use (gloo would otherwise take the address its hostname resolves to)."""
    hostname, port = host_port(addr)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(hostname), port))  # UDP: routes, sends nothing
        return probe.getsockname()[0]


def form(
    store: dist.Store, generation: int, rank: int, size: int, interface: str, timeout_s: float
) -> dist.ProcessGroup:
    """Generation `generation`'s group, once all `size` ranks joined (within `timeout_s`,
    else RuntimeError). Its keys in the store are its own: a stale member of an older
    generation cannot take a seat in this one."""
    prefixed = dist.PrefixStore(f"generation-{generation}", store)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=interface)]
    return dist.ProcessGroupGloo(prefixed, rank, size, opts)


def exchange_header(group: dist.ProcessGroup, header: Sequence[int] | None) -> list[int]:
    """The trainer's `header` (None on a member), as every member receives it."""
    values = np.zeros(HEADER_LEN, np.int64)
    if header is not None:
        values[: len(header)] = header
    broadcast(group, values.view(np.uint8))
    return [int(v) for v in values]


def broadcast(group: dist.ProcessGroup, data: np.ndarray) -> None:
    """`data` (uint8, contiguous) from rank 0 into every member's array of the same size."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([torch.from_numpy(data)], opts).wait()


def reason(error: Exception) -> str:
    """A gloo error's first sentence, without the source location it opens with."""
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", line).split(". ")[0]
