"""The process group weights.mode collective broadcasts versions over, and what travels on it.

Trainer rank 0 is rank 0 of a group of its own with the samplers it invited (ranks 1..n in the
order it named them), made by torch.distributed over gloo: never the trainer's DeepSpeed
group, which only its ranks share. The group meets at the rendezvous the trainer hosts on
weights.collective_addr (grpo.weights.collective.rendezvous); each new membership is a new
generation with keys of its own there.
Every operation is bounded by weights.collective_timeout_s: a member that dies fails the others'
next operation at once, one that stalls fails it when the bound passes, and nobody waits
longer.

Each message opens with a header of HEADER_LEN uint64s from the trainer (a version follows,
or nothing: a keepalive, or "move to the next generation"), then, for a version, its manifest
(msgpack, as the stream mode's) and each bucket's tensors, back to back, as one uint8
broadcast. A version cut like the one before it in the same generation (every version of a
run after the first) sends no manifest: the header carries its buckets' digests, the rest is
the previous manifest's. A LoRA adapter's broadcast is then two operations, not three, and
neither side encodes or decodes 240 tensors' specs.

A gloo send completes only once its receiver takes it, so every message, a keepalive
included, tells the trainer that each member is still there.
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

FIELDS = 4  # kind, then up to three values
SUM_WORDS = 4  # a bucket digest (BLAKE3, 256 bits) is four uint64s
MAX_INLINE_SUMS = 15  # bucket digests a header carries after its fields
HEADER_LEN = FIELDS + MAX_INLINE_SUMS * SUM_WORDS
KEEPALIVE = 1  # [KEEPALIVE, first, 0, 0]: nothing to receive; versions >= first will come
# [VERSION, version, manifest bytes, 0]: the manifest and the buckets follow;
# [VERSION, version, 0, n, sum 1 .. sum n]: cut like the previous version, the buckets follow
VERSION = 2
REFORM = 3  # [REFORM, generation, 0, 0]: this group ends; its members join that generation
MAX_MANIFEST_BYTES = 64 << 20


def local_interface(addr: str) -> str:
    """This host's address on the route to `addr`'s host: the one the group's connections
    use (gloo would otherwise take the address its hostname resolves to)."""
    hostname, port = host_port(addr)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(hostname), port))  # UDP: routes, sends nothing
        return probe.getsockname()[0]


def prefix(generation: int, key: str) -> str:
    """Generation `generation`'s keys in the rendezvous: under `key`, the generation's secret
    the trainer announces over the control channel, so that a stale member of an older
    generation, or a peer that reaches the rendezvous but never heard the announcement, cannot
    take a seat in this one (the seats' keys were "generation-G/..." for anyone to guess)."""
    return f"generation-{generation}-{key}"


def form(
    store: dist.Store, prefix: str, rank: int, size: int, interface: str, timeout_s: float
) -> dist.ProcessGroup:
    """The group whose keys in the rendezvous `store` are under `prefix`, once all `size`
    ranks joined (within `timeout_s`, else RuntimeError)."""
    prefixed = dist.PrefixStore(prefix, store)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=interface)]
    return dist.ProcessGroupGloo(prefixed, rank, size, opts)


def exchange_header(
    group: dist.ProcessGroup, header: Sequence[int] | None, sums: Sequence[str] = ()
) -> tuple[list[int], tuple[str, ...]]:
    """The trainer's `header` (None on a member) and the bucket digests (hex) after it, as
    every member receives them: (fields, digests), as many digests as the fourth field says."""
    values = np.zeros(HEADER_LEN, np.uint64)
    if header is not None:
        values[: len(header)] = header
        inline = np.frombuffer(bytes.fromhex("".join(sums)), np.uint64)
        values[FIELDS : FIELDS + inline.size] = inline
    broadcast(group, values.view(np.uint8))
    fields = [int(v) for v in values[:FIELDS]]
    raw = values[FIELDS : FIELDS + min(fields[3], MAX_INLINE_SUMS) * SUM_WORDS].tobytes()
    step = SUM_WORDS * 8
    return fields, tuple(raw[k : k + step].hex() for k in range(0, len(raw), step))


def broadcast(group: dist.ProcessGroup, data: np.ndarray) -> None:
    """`data` (uint8, contiguous) from rank 0 into every member's array of the same size."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([torch.from_numpy(data)], opts).wait()


def reason(error: Exception) -> str:
    """A gloo error's first sentence, without the source location it opens with."""
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", line).split(". ")[0]
