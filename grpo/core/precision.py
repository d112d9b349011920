"""Which parameter dtype a node computes natively: what `model.dtype: auto` becomes.

bfloat16 halves the weights' memory and, where the hardware has it, the time of a step. Where it
does not, it is emulated: on an AVX2-only CPU a bfloat16 matmul of the embedded model's shape
took 45x its float32 one (22 ms against 0.49, one thread), and the CPU demo's first batch came
at 19 generated tokens/s against 68 in float32.
"""

from __future__ import annotations

from pathlib import Path

# /proc/cpuinfo flags of the CPUs whose bfloat16 matmuls are instructions, not emulation.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def native_dtype(cpuinfo_path: Path = Path("/proc/cpuinfo")) -> str:
    """ "bfloat16" on a CUDA GPU that supports it or a CPU with BF16_CPU_FLAGS, else "float32".
    torch is imported here only: loading a config that does not ask for auto stays light."""
    import torch

    if torch.cuda.is_available():
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    try:
        flags = cpu_flags(cpuinfo_path.read_text())
    except OSError:  # not Linux: no way to tell, and float32 is never slow
        flags = set()
    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"
