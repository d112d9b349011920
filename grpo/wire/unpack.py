"""msgpack with bounded memory: what one header can make this process allocate.

msgpack's own limits (max_array_len, max_map_len, ...) bound each container's length, not what
a header costs once unpacked:

- an empty map is one byte on the wire and a 64-byte dict in Python: a 1 MiB header of them
  cost ~72 MiB;
- an array's declared length is allocated before its elements arrive: 1,000 nested array
  headers of 5 bytes, each declaring 5,000 elements, cost 40 MB, 8,000 times their size (a
  1 MiB header of them, gigabytes).

So the top of a header is walked here: maps (the header, a message's body and the maps in it,
at most MAX_MAP_DEPTH deep) key by key, arrays by their declared length, checked against the
bytes left, then their elements one by one through msgpack's own iterator, whose limits bound
every container inside an element (arrays to NESTED_ARRAY_LEN: msgpack allocates those before
their elements). And every container built counts against a budget of one per
BYTES_PER_CONTAINER header bytes: a real batch header carries about 18 bytes and one map (its
reward_info) per episode. What is left is the cost of Python objects themselves, at most ~20
times their msgpack bytes (two-character strings).
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import msgpack

MAX_MAP_DEPTH = 8  # the deepest real one: header, body, acknowledgements, sampler, set
NESTED_ARRAY_LEN = 16  # arrays inside an array's elements: [first, last] pairs at most
NESTED_MAP_LEN = 1024  # maps inside an array's elements: an episode's reward_info
BYTES_PER_CONTAINER = 8
_SLACK = 256  # containers any header may hold, however short

_MAPS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
_ARRAYS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}


class _Budget:
    """Counts the containers built; past the budget, unpacking stops (msgpack calls `count`
    for each map and array it completes, the walk for each it builds)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def count(self, container: Any) -> Any:
        self.used += 1
        if self.used > self.limit:
            raise ValueError(f"more than {self.limit} maps and arrays for the header's size")
        return container


def unpack_bounded(raw: memoryview) -> Any:
    """The msgpack value `raw` holds, all of it; ValueError (or msgpack's own exceptions) for
    anything malformed or beyond the bounds above."""
    n = raw.nbytes
    budget = _Budget(n // BYTES_PER_CONTAINER + _SLACK)
    up = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=True,
        max_buffer_size=max(n, 1),
        max_str_len=n,
        max_bin_len=n,
        max_array_len=NESTED_ARRAY_LEN,
        max_map_len=NESTED_MAP_LEN,
        max_ext_len=0,  # ext types are refused outright
        object_hook=budget.count,
        list_hook=budget.count,
    )
    up.feed(raw)
    value = _walk(up, raw, budget, 0)
    if up.tell() != n:
        raise ValueError(f"{n - up.tell()} bytes after the value")
    return value


def _walk(up: msgpack.Unpacker, raw: memoryview, budget: _Budget, depth: int) -> Any:
    pos = up.tell()
    if pos >= raw.nbytes:
        raise ValueError("the value ends early")
    first = raw[pos]
    if first in _MAPS:
        if depth >= MAX_MAP_DEPTH:
            raise ValueError(f"maps nested deeper than {MAX_MAP_DEPTH}")
        size = up.read_map_header()
        if 2 * size > raw.nbytes - up.tell():  # a key and a value: a byte each at least
            raise ValueError(f"a map of {size} entries in {raw.nbytes - up.tell()} bytes")
        out = {}
        for _ in range(size):
            key = up.unpack()
            if not isinstance(key, (str, bytes)):
                raise ValueError(f"a map key is a {type(key).__name__}, not a str")
            out[key] = _walk(up, raw, budget, depth + 1)
        return budget.count(out)
    if first in _ARRAYS:
        size = up.read_array_header()
        if size > raw.nbytes - up.tell():  # a byte per element at least
            raise ValueError(f"an array of {size} elements in {raw.nbytes - up.tell()} bytes")
        items = list(islice(up, size))  # each element in C, under the nested limits
        if len(items) != size:
            raise ValueError("the value ends early")
        return budget.count(items)
    return up.unpack()
