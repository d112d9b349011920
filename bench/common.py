"""Shared by the benchmarks: one table row printed and one JSON file per benchmark."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from grpo.runtime.lifetime import parent_of

# BENCH_RESULTS redirects the JSON (the test suite's quick run must not overwrite real results)
RESULTS = Path(os.environ.get("BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


def machine() -> str:
    import torch

    return (f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, "
            f"torch {torch.__version__}")  # fmt: skip


# How a row's ratio is computed and what meets its target, declared by each row:
#   "baseline/ours": ours is a cost (seconds, bytes): ratio = baseline / ours >= target
#   "ours/baseline": ours is a rate or a share of the baseline: ratio = ours / baseline >= target
#   "ours<=target":  ours is an absolute level with a ceiling: met = ours <= target; the ratio,
#                    baseline / ours, is shown only for comparison
Direction = Literal["baseline/ours", "ours/baseline", "ours<=target"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
MIN_REPEATS = 3  # a row measured fewer times cannot be met: its spread is unknown


def worst_case(direction: Direction, baseline_spread: tuple[float, float],
               ours_spread: tuple[float, float]) -> float:  # fmt: skip
    """The least favourable value over the repetitions, compared with the target: for
    "baseline/ours" the baseline's fastest over ours' slowest, for "ours/baseline" ours' lowest
    over the baseline's highest, for "ours<=target" ours' highest."""
    (b_min, b_max), (o_min, o_max) = baseline_spread, ours_spread
    if direction == "baseline/ours":
        return b_min / o_max
    if direction == "ours/baseline":
        return o_min / b_max
    return o_max


@dataclass(frozen=True)
class Result:
    """One benchmark row. `baseline` and `ours` are the medians over `repeats` repetitions,
    `baseline_spread` and `ours_spread` their (min, max). `ratio` and `met` are computed here,
    never passed in: `ratio` from the medians, the declared `direction` and `target`; `met`
    needs the target reached beyond the spread, by the worst case of the repetitions
    (`worst_case`), and at least MIN_REPEATS repetitions. A row cannot claim a target its
    numbers, or their noise, do not reach. Higher ratios are better. `scenario` says what is
    run, on what, what the baseline is and why a user would run it. `quick` marks a --quick run
    (small sizes, tiny model), whose numbers are not results. Build rows with `Result.of`."""

    name: str
    unit: str
    baseline: float
    ours: float
    direction: Direction
    ratio: float = field(init=False)
    target: float
    met: bool = field(init=False)
    machine: str
    notes: str = ""
    quick: bool = False
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())
    scenario: str = field(kw_only=True)
    repeats: int = field(kw_only=True)
    baseline_spread: tuple[float, float] = field(kw_only=True)
    ours_spread: tuple[float, float] = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.name}: direction {self.direction!r} not one of {DIRECTIONS}")
        if not self.scenario.strip():
            raise ValueError(f"{self.name}: no scenario")
        if self.repeats < 1:
            raise ValueError(f"{self.name}: {self.repeats} repeats")
        for median, (low, high) in ((self.baseline, self.baseline_spread),
                                    (self.ours, self.ours_spread)):  # fmt: skip
            if not low <= median <= high:
                raise ValueError(f"{self.name}: median {median} outside its spread {low}-{high}")
        ratio = (self.ours / self.baseline if self.direction == "ours/baseline"
                 else self.baseline / self.ours)  # fmt: skip
        worst = worst_case(self.direction, self.baseline_spread, self.ours_spread)
        reached = worst <= self.target if self.direction == "ours<=target" else worst >= self.target
        object.__setattr__(self, "baseline_spread", tuple(self.baseline_spread))
        object.__setattr__(self, "ours_spread", tuple(self.ours_spread))
        object.__setattr__(self, "ratio", ratio)  # frozen: set once, here
        object.__setattr__(self, "met", reached and self.repeats >= MIN_REPEATS)

    @classmethod
    def of(cls, name: str, unit: str, baselines: Sequence[float], ours: Sequence[float],
           direction: Direction, target: float, machine: str, scenario: str, notes: str = "",
           quick: bool = False) -> Result:  # fmt: skip
        """A row from every repetition's baseline and ours: their medians and (min, max);
        repeats = the fewer of the two counts."""
        if not baselines or not ours:
            raise ValueError(f"{name}: no measurements")
        return cls(name, unit, statistics.median(baselines), statistics.median(ours), direction,
                   target, machine, notes, quick, scenario=scenario,
                   repeats=min(len(baselines), len(ours)),
                   baseline_spread=(min(baselines), max(baselines)),
                   ours_spread=(min(ours), max(ours)))  # fmt: skip


def number_text(value: float) -> str:
    """Three significant digits, trailing zeros kept, no exponent."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:#.3g}".rstrip(".")


def spread_text(spread: Sequence[float]) -> str:
    """(min, max) as min-max."""
    return f"{number_text(spread[0])}-{number_text(spread[1])}"


def target_text(direction: Direction, target: float) -> str:
    """What a row must reach: its ratio at least the target, or ours at most it."""
    if direction == "ours<=target":
        return f"ours ≤ {number_text(target)}"
    return f"ratio ≥ {number_text(target)}"


def report(result: Result, results_dir: Path = RESULTS) -> Result:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result.name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2) + "\n")
    os.replace(tmp, path)
    print(f"{result.name:<34} {result.baseline:>12.4g} {result.ours:>12.4g} {result.unit:<10} "
          f"ratio {result.ratio:>6.2f}  {target_text(result.direction, result.target)}  "
          f"{'met' if result.met else 'NOT met'} ({result.repeats} repeats; baseline "
          f"{spread_text(result.baseline_spread)}, ours {spread_text(result.ours_spread)})  "
          f"{result.notes}", flush=True)  # fmt: skip
    return result


def interleaved_rounds(
    fns: dict[str, Callable[[], object]], rounds: int = 5, repeat: int = 4, warmup: int = 1
) -> dict[str, list[float]]:
    """Each function's fastest run in each of `rounds` rounds of `repeat` runs: one value per
    round and function, the repetitions a Result's spread is taken over."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, best in interleaved_best_times(fns, repeat, warmup=0).items():
            out[name].append(best)
    return out


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


def _unassigned_ports() -> range:
    """Ports the kernel never hands out by itself: those below its ephemeral range, split
    between pytest-xdist's workers. A port from the ephemeral range, found free, can be taken
    by any program's next connection or gloo's listener before the run that was given it
    binds it (seen: EADDRINUSE in the suite)."""
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    ephemeral_low = int(path.read_text().split()[0]) if path.exists() else 32768
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    share = max(0, ephemeral_low - 10000) // workers
    return range(10000 + worker * share, 10000 + (worker + 1) * share)


_next_port = random.randrange(1 << 16)  # where this process starts in its share


def free_port() -> int:
    """A loopback port nobody listens on, from this process's share of the unassigned ones
    (any free port where there are too few of those)."""
    global _next_port
    ports = _unassigned_ports()
    for _ in range(min(len(ports), 1000)):
        port = ports[_next_port % len(ports)]
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_hf() -> None:
    """No per-shard progress bars from transformers in the benchmark tables."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


REPO = Path(__file__).resolve().parents[1]
MODEL = {False: "SmolLM2-135M", True: "the tiny model"}  # by `quick`: what a scenario names


# The engine a run of the tiny model (tests/tiny_model.py) on configs/cpu_demo.yaml uses: HF
# generate, as vLLM's CPU attention has no kernel for its head size (16).
TINY_ENGINE = "rollout.backend=hf"


def loopback_overrides(timeout_s: float = 60) -> list[str]:
    """Fresh loopback ports per run, so no run meets a previous run's sockets."""
    return [
        f"transport.episodes_addr=tcp://127.0.0.1:{free_port()}",
        f"transport.control_addr=tcp://127.0.0.1:{free_port()}",
        f"train.master_port={free_port()}",
        f"transport.peer_timeout_s={timeout_s}",
        "transport.startup_timeout_s=300",
        "transport.heartbeat_s=0.5",
    ]


def launch_run(config: Path, out_dir: Path, name: str, overrides: list[str],
               one_thread: bool = False, timeout_s: float = 1200) -> list[dict]:  # fmt: skip
    """`bash launch.sh config` with both roles on this machine; its metrics.jsonl rows.

    `one_thread` gives every process (sampler and each trainer rank) one thread, so that on a
    small machine the roles do not fight over cores and overlap is measured, not contention."""
    return launch_watched(config, out_dir, name, overrides, one_thread, timeout_s)[0]


def launch_watched(config: Path, out_dir: Path, name: str, overrides: list[str],
                   one_thread: bool = False, timeout_s: float = 1200
                   ) -> tuple[list[dict], int]:  # fmt: skip
    """launch_run's run, its output in OUT_DIR/NAME.log; its rows and the peak memory of all
    its processes together (run_watched)."""
    cmd = ["bash", str(REPO / "launch.sh"), str(config), f"output_dir={out_dir}", f"name={name}",
           *loopback_overrides(), *overrides]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if one_thread:
        env["OMP_NUM_THREADS"] = "1"
    out_dir.mkdir(parents=True, exist_ok=True)
    peak = run_watched(cmd, env, out_dir / f"{name}.log", timeout_s)
    path = out_dir / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()], peak


def start_role(
    role: str, config: Path, overrides: list[str], log: Path, env: dict | None = None
) -> subprocess.Popen:
    """One launch.sh role (ROLE=trainer | sampler | both) in a session of its own, as on its
    own node; output appended to `log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ROLE": role, **(env or {})}
    return subprocess.Popen(
        ["bash", str(REPO / "launch.sh"), str(config), *overrides],
        cwd=REPO, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            children.setdefault(parent_of(int(proc.name)), []).append(int(proc.name))
        except OSError:
            continue  # exited meanwhile
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a role and everything it started at once, as a node crash would (torchrun puts
    its ranks in sessions of their own, so the process group is not enough)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def steps_per_hour(rows: list[dict]) -> float:
    """From the first step's end to the last one's: start-up is not counted."""
    return (len(rows) - 1) * 3600 / (rows[-1]["time"] - rows[0]["time"])


def memory_of_tree(pid: int) -> int:
    """Bytes of memory held by process `pid` and its descendants: the sum of their PSS
    (proportional set size), in which a page shared by several of them (a library, a file
    mapping) counts once in all, not once in each as a sum of RSS would."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue  # exited meanwhile
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def run_watched(cmd: list[str], env: dict, log: Path, timeout_s: float, every_s: float = 0.5
                ) -> int:  # fmt: skip
    """Run `cmd` (output to `log`), sampling its process tree's memory every `every_s`; the
    peak in bytes. RuntimeError with the log's tail if it exits non-zero or runs too long."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        deadline, peak = time.monotonic() + timeout_s, 0
        while proc.poll() is None:
            if time.monotonic() > deadline:
                kill_tree(proc)
                raise RuntimeError(f"{cmd[:4]} ran past {timeout_s:.0f} s; its log: {log}")
            peak = max(peak, memory_of_tree(proc.pid))
            time.sleep(every_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} exited {proc.returncode}:\n"
                           f"{log.read_text()[-3000:]}")  # fmt: skip
    return peak
