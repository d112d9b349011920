"""Continuous generation (rollout.mode: continuous) against lock-step, end to end, and the cost of
an in-flight weight update with each rollout.kv_on_update.

Row 1, `continuous_tokens_per_s_vs_lockstep`: real runs, the sampler and the trainer each a
`ROLE=... bash launch.sh` of its own pinned to a core of its own (sampler core 0, trainer core 1,
one thread each), as two nodes would be. Same config but for the mode: train.max_staleness 2
(lock-step overlaps rounds too), slots = Q x G = 16. Continuous needs
algo.rollout_correction=decoupled there; lock-step HF reports no engine log-probs and takes
none (its correction is the old-policy ratio alone), so that is the one other difference.
Ours / baseline = generated tokens trained per second of wall clock, from the first step's end
to the last one's (start-up not counted); the median of REPS runs of each, interleaved. The
trainer's idle share (its `recv_s`, the time it waits for a batch, over that wall clock) is in
the notes, and so is what the rate is made of: each engine's tokens/s while it generates,
lock-step's share of row-steps that produce a token (sum of the lengths / (Q x G x the
longest)) and continuous's slot occupancy and paced share (steps whose free slots the
staleness bound kept empty).

Workload: the tiny random Llama (tests/tiny_model.py, 3 M parameters) with stop strings "x" and
"z": about 3% of its near-uniform draws contain one, so answer lengths are geometric (mean
about 30), capped at 64 new tokens, where about one answer in ten ends; most batches of 16 wait
for a capped answer, the long tail lock-step pays for and continuous mode is for. Why the tiny
model: a decode step then costs nearly the same for 1 or 16 rows (fixed per-step costs), as
on a GPU in the memory-bound decode regime, so the tail, not arithmetic, sets lock-step's
rate; and 8 steps of a run take seconds, so repetitions fit in minutes. SmolLM2-135M on one
core would spend a step on arithmetic proportional to the rows (a CPU artefact) and take
minutes a run. A low learning rate keeps the length distribution from drifting over a run.

What it shows (2026-11-26): 2.02x (ratios per pair 2.14, 2.18, 1.82). While generating,
continuous makes 525 tokens/s at a slot occupancy of 0.61 against lock-step's 141 tokens/s
with 0.40 of its row-steps making a token: about 1.5x from keeping the slots full and 2.4x
from the cost of a decode step (HFSlotEngine's own loop against HF generate with its stop-
string criterion, on a model this small). End to end both are below that: the sampler also
scores the old log-probs at each cut and waits there for the version of the batch after next
(the staleness bound keeps 0.38 of its steps from admitting). The notes carry each part, so
a change to any shows.

Row 2, `continuous_update_cost_keep_vs_recompute`: in process, the HF continuous engine on the
embedded SmolLM2-135M with 16 answers in flight, each about 110 tokens (prompt and answer);
the engine's `load(v)` and the next step, on one thread as the pinned sampler of row 1, timed
with kv_on_update keep (the cache stays) and recompute (the cache of every answer in flight
rebuilt in one forward), alternating, median of REPS each; seconds per update, and as a
multiple of one decode step (median of the steps between). Baseline = recompute, ours = keep.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import REPO, Result, loopback_overrides, machine, quiet_hf, report

REPS = 3  # runs of each mode (row 1), updates of each kv mode (row 2)
Q, G = 4, 4
STEPS = 8
MAX_NEW = 64
STOP = ["x", "z"]
STALENESS = 2
TOKENS_TARGET = 1.5  # continuous at 1.5x lock-step's tokens/s
UPDATE_TARGET = 2.0  # a kept cache at least halves an update's cost (keep is the default)
CORES = {"sampler": 0, "trainer": 1}  # one each, as separate nodes


def _config(tmp: Path, model: Path, steps: int, max_new: int) -> Path:
    path = tmp / "continuous.yaml"
    path.write_text(json.dumps({  # YAML is a superset of JSON
        "name": "continuous",
        "model": {"path": str(model)},
        "data": {"reward": "tests.rewards_for_tests:text_length", "max_prompt_tokens": 256},
        "rollout": {"questions_per_step": Q, "group_size": G, "max_new_tokens": max_new,
                    "stop": STOP},
        "train": {"total_steps": steps, "lr": 1e-6, "micro_batch_size": 8, "num_ranks": 1,
                  "sync_interval": 1, "max_staleness": STALENESS, "keep_versions": 4},
        "eval": {"interval": 0},
    }))  # fmt: skip
    return path


def _pinned(pid: int) -> set[str]:
    """The cores each process of a role's tree may run on (Cpus_allowed_list)."""
    from bench.common import descendants

    lists = set()
    for p in [pid, *descendants(pid)]:
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        lists |= {ln.split()[1] for ln in text.splitlines() if ln.startswith("Cpus_allowed_list")}
    return lists


def launch_pinned(config: Path, out: Path, name: str, overrides: list[str]) -> list[dict]:
    """One run: each role a launch.sh of its own on its own core, one thread; its metrics rows.
    Checks, while the run is on, that every process of each role stays on its core."""
    ovr = [f"output_dir={out}", f"name={name}", *loopback_overrides(), *overrides]
    # the roles run on this interpreter (launch.sh's default is the checkout's .venv)
    env = {"PYTHON": sys.executable, **os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = {}
    for role, core in CORES.items():
        procs[role] = subprocess.Popen(
            ["taskset", "-c", str(core), "bash", str(REPO / "launch.sh"), str(config), *ovr],
            cwd=REPO, env={**env, "ROLE": role}, stdout=(out / f"{name}.{role}.log").open("w"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    seen: dict[str, set[str]] = {role: set() for role in procs}
    try:
        deadline = time.monotonic() + 900
        while any(p.poll() is None for p in procs.values()):
            for role, p in procs.items():
                seen[role] |= _pinned(p.pid)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} timed out")
            time.sleep(1)
    finally:
        for p in procs.values():  # a failed role: launch.sh's own teardown, then the rest
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)
    failed = {r: p.returncode for r, p in procs.items() if p.returncode}
    if failed:
        tail = (out / f"{name}.{next(iter(failed))}.log").read_text()[-3000:]
        raise RuntimeError(f"{name}: {failed}\n{tail}")
    for role, core in CORES.items():
        assert seen[role] <= {str(core)}, f"{name}: the {role} ran on cores {seen[role]}"
    path = out / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rates(rows: list[dict]) -> dict[str, float]:
    """From the first step's end to the last one's: trained tokens/s, the trainer's idle share,
    and what makes them up."""
    timed = rows[1:]
    wall = rows[-1]["time"] - rows[0]["time"]
    tokens = sum(sum(r["completion_lens"]) for r in timed)
    out = {
        "tokens_per_s": tokens / wall,
        "idle": sum(r["recv_s"] for r in timed) / wall,
        "gen_rate": sum(r["sampler_gen_tokens"] for r in timed)
        / sum(r["sampler_gen_s"] for r in timed),
        "mean_len": tokens / sum(len(r["completion_lens"]) for r in timed),
        # lock-step: the share of row-steps that make a token (each batch waits for its longest)
        "row_use": sum(sum(r["completion_lens"]) for r in timed)
        / sum(len(r["completion_lens"]) * max(r["completion_lens"]) for r in timed),
    }
    if "sampler_paced_share" in timed[0]:  # continuous (lock-step reports no pacing)
        out["occupancy"] = statistics.mean(r["sampler_slot_occupancy"] for r in timed)
        out["paced"] = statistics.mean(r["sampler_paced_share"] for r in timed)
    return out


def _spread(values: list[float], fmt: str = ".0f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


TOKENS_SCENARIO = (
    "real launch.sh runs, sampler and trainer each a role pinned to a core of its own (one "
    "thread), the tiny random model with stop strings (answers geometric, mean about 24, capped "
    "at 64), Q=4 x G=4, max_staleness 2, 16 slots; trained tokens/s from the first step's end "
    "to the last; ours: rollout.mode continuous; baseline: rollout.mode lockstep, HF generate "
    "per batch, what a user runs without continuous batching"
)
UPDATE_SCENARIO = (
    "HFSlotEngine with SmolLM2-135M, 16 answers in flight (32 prompt + 80 generated tokens "
    "cached), one weight update then the next decode step; ours: kv_on_update keep; baseline: "
    "kv_on_update recompute, the project's own exact mode (rebuild every cache under the new "
    "weights), not an outside alternative"
)


def end_to_end(tmp: Path, quick: bool) -> Result:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

    tiny = build_tiny_model(tmp / "tiny", ensure_embedded_base())
    steps, max_new, reps = (3, 16, 1) if quick else (STEPS, MAX_NEW, REPS)
    config = _config(tmp, tiny, steps, max_new)
    modes = {
        "lockstep": ["rollout.mode=lockstep"],
        "continuous": ["rollout.mode=continuous", f"rollout.slots={Q * G}",
                       "algo.rollout_correction=decoupled"],
    }  # fmt: skip
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    t0 = time.monotonic()
    for rep in range(reps):  # interleaved: neither mode gets the quieter minutes
        order = list(modes) if rep % 2 == 0 else list(modes)[::-1]
        if quick:  # the suite's smoke run: both at once, the numbers mean nothing
            threads = [threading.Thread(target=lambda m=m, rep=rep: runs[m].append(rates(
                launch_pinned(config, tmp, f"{m}{rep}", modes[m])))) for m in order]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if any(len(runs[m]) <= rep for m in modes):
                raise RuntimeError("a quick run failed (its exception is above)")
        else:
            for m in order:
                runs[m].append(rates(launch_pinned(config, tmp, f"{m}{rep}", modes[m])))
    took = time.monotonic() - t0
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    lock, cont = runs["lockstep"], runs["continuous"]
    note = (
        f"tiny model, Q={Q} x G={G}, stop {STOP}, cap {max_new}, max_staleness {STALENESS}, "
        f"slots {Q * G}; sampler core 0, trainer core 1, 1 thread; {steps} steps, "
        f"median (min-max) of {reps} runs each, interleaved ({took:.0f} s): tokens/s lock-step "
        f"{_spread([r['tokens_per_s'] for r in lock])}, continuous "
        f"{_spread([r['tokens_per_s'] for r in cont])}; ratio per pair "
        + ", ".join(
            f"{c['tokens_per_s'] / b['tokens_per_s']:.2f}" for b, c in zip(lock, cont, strict=True)
        )
        + f"; trainer idle share lock-step {_spread([r['idle'] for r in lock], '.2f')}, "
        f"continuous {_spread([r['idle'] for r in cont], '.2f')}; mean answer "
        f"{med['lockstep']['mean_len']:.1f} / {med['continuous']['mean_len']:.1f} tokens; "
        f"while generating: lock-step {med['lockstep']['gen_rate']:.0f} tokens/s with "
        f"{med['lockstep']['row_use']:.2f} of its row-steps making a token, continuous "
        f"{med['continuous']['gen_rate']:.0f} tokens/s with slot occupancy "
        f"{med['continuous']['occupancy']:.2f} and paced share {med['continuous']['paced']:.2f}"
    )
    return Result.of("continuous_tokens_per_s_vs_lockstep", "tokens/s",
                     [r["tokens_per_s"] for r in lock], [r["tokens_per_s"] for r in cont],
                     "ours/baseline", TOKENS_TARGET, machine(), TOKENS_SCENARIO, note,
                     quick)  # fmt: skip


def update_cost(tmp: Path, quick: bool) -> Result:
    """load(v) + the next step with 16 answers in flight, keep against recompute,
    on one thread."""
    import torch

    quiet_hf()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pinned sampler; 2 threads on a loaded 2 cores spin (10x)
    try:
        return _update_cost(tmp, quick)
    finally:
        torch.set_num_threads(threads)


def _update_cost(tmp: Path, quick: bool) -> Result:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.models.convert import ensure_embedded_base
    from grpo.models.loading import load_tokenizer
    from grpo.rollout.hf_slots import HFSlotEngine
    from grpo.rollout.slots import SlotRequest
    from grpo.weights.version import Version
    from tests.tiny_model import build_tiny_model

    base = ensure_embedded_base()
    path = build_tiny_model(tmp / "tiny_update", base) if quick else base
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(path)
    slots, prompt_len, grown = (16, 16, 8) if quick else (16, 32, 80)
    rng = np.random.default_rng(0)
    ids = rng.integers(100, len(tokenizer) - 100, size=(slots, prompt_len)).astype(np.int32)
    # no stop string, no EOS reached in the steps taken (a cap beyond them): none finishes
    engine = HFSlotEngine(model, tokenizer, slots, temperature=1.0)
    engine.eos = set()
    engine.admit([SlotRequest(i, ids[i], i, 10_000) for i in range(slots)])
    for _ in range(grown):
        engine.step()
    times: dict[str, list[float]] = {"keep": [], "recompute": []}
    steps: list[float] = []
    version = 0
    for _ in range(1 if quick else REPS):
        for mode in times:  # alternating, the caches growing alike
            t0 = time.perf_counter()
            engine.step()  # a plain decode step before each update, for the unit
            steps.append(time.perf_counter() - t0)
            engine.kv_on_update, version = mode, version + 1
            t0 = time.perf_counter()
            engine.load(Version(version, False))
            assert not engine.step(), "an answer finished"
            times[mode].append(time.perf_counter() - t0)
    cached = engine.mask.shape[1]
    step = statistics.median(steps)
    keep, recompute = statistics.median(times["keep"]), statistics.median(times["recompute"])
    name = "tiny model" if quick else "SmolLM2-135M"
    note = (f"HFSlotEngine, {name}, {slots} answers in flight, {cached} cached tokens each "
            f"(prompt {prompt_len} + answer), {torch.get_num_threads()} threads; "
            f"load(v) + next step, median (min-max) of {len(times['keep'])} each, "
            f"alternating: keep {_spread(times['keep'], '.3f')} s = {keep / step:.2f} decode "
            f"steps, recompute {_spread(times['recompute'], '.3f')} s = "
            f"{recompute / step:.1f} decode steps; a decode step {step:.3f} s "
            f"(median of {len(steps)})")  # fmt: skip
    return Result.of("continuous_update_cost_keep_vs_recompute", "s", times["recompute"],
                     times["keep"], "baseline/ours", UPDATE_TARGET, machine(), UPDATE_SCENARIO,
                     note, quick)  # fmt: skip


def run(quick: bool = False) -> list[Result]:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        rows = [end_to_end(tmp, quick), update_cost(tmp, quick)]
    return [report(r) for r in rows]


if __name__ == "__main__":
    run("--quick" in sys.argv)
