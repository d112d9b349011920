"""Crash recovery: SIGKILL the whole trainer mid-run, then finish the run two ways.

ours:     restart the trainer with resume (its saved state, the sampler's spool resent);
baseline: what a crash costs without resume: start both roles again from step 0.

Both on the embedded SmolLM2-135M (tiny random model with --quick), 2 trainer ranks, the state
saved every 2 steps. Time = from the kill to the run's last step. The resumed run must also be
exact: every batch trained once, none lost (checked from metrics.jsonl, as the chaos tests do).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench.common import (
    REPO,
    TINY_ENGINE,
    Result,
    kill_tree,
    loopback_overrides,
    machine,
    report,
    start_role,
)

CONFIG = REPO / "configs" / "cpu_demo.yaml"


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _wait(procs, cond, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError(f"a role failed: {[p.returncode for p in procs]}")
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.5)


def _crash(tmp: Path, name: str, common: list[str], kill_after: int) -> tuple[float, Path, list]:
    """Run until `kill_after` steps are done, SIGKILL the trainer tree; (kill time, run dir,
    the live sampler and logs)."""
    overrides = [*common, f"name={name}"]
    run_dir = tmp / name
    trainer = start_role("trainer", CONFIG, overrides, tmp / f"{name}.trainer.log")
    sampler = start_role("sampler", CONFIG, overrides, tmp / f"{name}.sampler.log")
    _wait([trainer, sampler], lambda: len(_rows(run_dir)) >= kill_after)
    kill_tree(trainer)
    return time.monotonic(), run_dir, [sampler]


SCENARIO = (
    "the demo config ({model}, state every 2 steps) for {total} steps, the trainer's "
    "whole process tree SIGKILLed after step {kill} of {total}; ours: restart the "
    "trainer with train.resume=auto (it continues from the last state, the sampler "
    "resends its spooled batches); baseline: start both roles again from step 0, what "
    "a user without resume does; time from the kill to the last step; one run each. "
    "The kill late in the run favours resume: restarting from scratch loses {kill} "
    "steps"
)


def run(quick: bool = False) -> list[Result]:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

    total, kill_after = (4, 3) if quick else (6, 5)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        common = [f"output_dir={tmp}", *loopback_overrides(timeout_s=600), "eval.interval=0",
                  f"train.total_steps={total}", "train.state_interval=2",
                  f"rollout.max_new_tokens={16 if quick else 64}"]  # fmt: skip
        if quick:  # the suite's smoke run: a tiny model on one rank
            common += [f"model.path={build_tiny_model(tmp / 'tiny', ensure_embedded_base())}",
                       "train.num_ranks=1", TINY_ENGINE]  # fmt: skip

        # ours: restart the trainer alone, with resume; the sampler lives on
        killed, run_dir, (sampler,) = _crash(tmp, "resumed", [*common, "train.resume=auto"],
                                             kill_after)  # fmt: skip
        ours = [*common, "train.resume=auto", "name=resumed"]
        trainer = start_role("trainer", CONFIG, ours, tmp / "resumed.trainer.log")
        for p in (trainer, sampler):
            if p.wait(timeout=1800) != 0:
                raise RuntimeError(f"resumed run failed: see {tmp}")
        ours_s = time.monotonic() - killed
        rows = _rows(run_dir)
        seqs = sorted(r["batch_seq"] for r in rows)
        assert seqs == list(range(total)), f"not exactly once: {seqs}"
        duplicates = rows[-1]["duplicates_dropped"]
        state_s = max(r["state_s"] for r in rows)

        # baseline: no resume, both roles again from the start (--quick: the fresh run
        # alone, without the crash before it, which only sets the scene)
        if quick:
            killed = time.monotonic()
        else:
            killed, _, (sampler,) = _crash(tmp, "fresh", common, kill_after)
            kill_tree(sampler)
        again = start_role("both", CONFIG, [*common, "name=fresh"], tmp / "fresh.again.log")
        if again.wait(timeout=1800) != 0:
            raise RuntimeError(f"fresh restart failed: see {tmp}")
        baseline_s = time.monotonic() - killed
    model = "tiny model, 1 rank" if quick else "SmolLM2-135M, 2 ranks"
    note = (f"{model}, killed after step {kill_after} of {total}, state every 2 steps "
            f"(one save {state_s:.1f} s); resumed: {total} batches trained once, "
            f"{duplicates} duplicate dropped, 0 lost")  # fmt: skip
    return [
        report(Result.of("recovery_resume_vs_restart", "s", [baseline_s], [ours_s],
                         "baseline/ours", 1.5, machine(),
                         SCENARIO.format(model=model, kill=kill_after, total=total), note,
                         quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    import sys

    run("--quick" in sys.argv)
