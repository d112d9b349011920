"""Freed large buffers are reused, not handed back to the kernel (grpo/runtime/host_memory.py)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

# Page faults taken by a second 256 MB buffer after the first was freed: about 65,000 (one per
# 4 KiB page, each zeroed by the kernel) when glibc unmapped the first, a handful when reused.
SECOND_BUFFER_FAULTS = """
import ctypes, resource, sys
from grpo.runtime.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size = 256 * 2**20
def touched_and_freed():
    buf = libc.malloc(ctypes.c_size_t(size))
    ctypes.memset(buf, 1, size)
    libc.free(ctypes.c_void_p(buf))
touched_and_freed()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touched_and_freed()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_buffer_is_reused_without_new_page_faults():
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", SECOND_BUFFER_FAULTS, mode], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        return int(done.stdout)

    assert faults("default") > 30_000  # glibc's own behaviour: the test can tell
    assert faults("keep") < 1_000
