"""Shared by the benchmarks: one table row printed and one JSON file per benchmark."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# BENCH_RESULTS redirects the JSON (the test suite's quick run must not overwrite real results)
RESULTS = Path(os.environ.get("BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


def machine() -> str:
    import torch

    return (f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, "
            f"torch {torch.__version__}")  # fmt: skip


@dataclass(frozen=True)
class Result:
    """baseline and ours in `unit`; ratio = how many times better ours is (higher is better);
    met = ratio reached target."""

    name: str
    unit: str
    baseline: float
    ours: float
    ratio: float
    target: float
    met: bool
    machine: str
    notes: str = ""


def report(result: Result, results_dir: Path = RESULTS) -> Result:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result.name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2) + "\n")
    os.replace(tmp, path)
    print(f"{result.name:<34} {result.baseline:>12.4g} {result.ours:>12.4g} {result.unit:<10} "
          f"ratio {result.ratio:>6.2f}  target {result.target:>5.2f}  "
          f"{'met' if result.met else 'NOT met'}  {result.notes}", flush=True)  # fmt: skip
    return result


def best_time(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Fastest of `repeat` wall-clock runs in seconds (the least disturbed by other load)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def interleaved_best_times(
    fns: dict[str, Callable[[], object]], repeat: int = 5, warmup: int = 1
) -> dict[str, float]:
    """Fastest run of each function, measured in alternating rounds so that drift in the
    machine's state (caches, allocator, other load) does not favour whichever runs first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best
