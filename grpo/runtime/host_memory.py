"""How the C allocator of this process (glibc's malloc, which torch uses on the CPU) treats
large buffers.

glibc serves each allocation above 32 MB with a fresh mmap and unmaps it when it is freed, so
the same buffer in the next micro-batch is new memory that the kernel zeroes page by page. On
the CPU, a forward and backward allocates logits of hundreds of MB several times. perf showed
40% of a trainer step's time in the kernel's `clear_page_erms`, on 2 cores. When freed memory
stays in the heap for reuse, that cost is gone: `bench.run_all --quick --only padding` went
from 17.3 s to 13.4 s, and its system time from 5.3 s to 1.1 s. The price is a peak resident
set 35% higher.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_MAX = -4
_KEEP_UP_TO = 2**31 - 1  # free memory at the heap's top beyond this goes back (mallopt: an int)


def keep_freed_memory() -> bool:
    """Large buffers from the heap, and freed memory kept for reuse rather than returned to
    the kernel. Returns whether it applied (glibc on Linux; elsewhere nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_UP_TO))
