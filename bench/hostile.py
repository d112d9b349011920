"""The trainer's peak memory under the swelling-header attack, against a clean run.

A local peer sends the trainer's episode socket, for the whole run, headers of empty msgpack
maps (one byte each on the wire, a dict each if unpacked without limits: a 1 MiB header once
cost +64 MiB) and frames over `transport.max_frame_bytes`, as fast as the socket takes them
(tests/hostile_peer.py). The run is the CPU demo's (the embedded SmolLM2-135M; a tiny model
with --quick), one trainer rank; the peak is rank 0's resident set from the last metrics row.

ours: the attacked run's peak; baseline: the clean run's. Runs alternate, clean then attacked,
so drift in the machine's state favours neither; the medians are compared and the notes give
every run's peak.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.common import REPO, Result, loopback_overrides, machine, report, start_role

CONFIG = REPO / "configs" / "cpu_demo.yaml"
HEADER_BYTES = 1 << 20


def _peak_mib(tmp: Path, name: str, common: list[str], attacked: bool) -> float:
    """One run; rank 0's peak resident set in MiB."""
    from tests.hostile_peer import HostilePeer

    overrides = [*common, *loopback_overrides(timeout_s=600), f"name={name}"]
    addr = next(o.split("=", 1)[1] for o in overrides if o.startswith("transport.episodes_addr"))
    proc = start_role("both", CONFIG, overrides, tmp / f"{name}.log")
    peer = None
    if attacked:
        only = ("empty-maps header", "oversized frame")
        peer = HostilePeer(addr, None, 2 * HEADER_BYTES, only=only, pause_s=0.001).start()
    try:
        code = proc.wait(timeout=1800)
    finally:
        sent = peer.stop() if peer else {}
    if code != 0:
        raise RuntimeError(f"run {name} failed ({code}): see {tmp / f'{name}.log'}")
    rows = (tmp / name / "metrics.jsonl").read_text().splitlines()
    if attacked and sum(sent.values()) == 0:
        raise RuntimeError("the attack sent nothing")
    return json.loads(rows[-1])["trainer_peak_mem_gib"] * 1024


SCENARIO = (
    "the CPU demo ({model}, 1 trainer rank, {steps} steps), a local peer sending "
    "the trainer's episode socket 1 MiB headers of empty msgpack maps and oversized "
    "frames as fast as it takes them; ours: the attacked run's peak resident set of "
    "rank 0; baseline: the same run unattacked; clean and attacked runs alternate. The "
    "target allows 5%: met only if the worst case over the runs stays within it"
)


def run(quick: bool = False) -> list[Result]:
    from grpo.models.convert import ensure_embedded_base
    from tests.tiny_model import build_tiny_model

    reps, steps = (1, 2) if quick else (3, 2)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        common = [f"output_dir={tmp}", "eval.interval=0", f"train.total_steps={steps}",
                  "train.num_ranks=1", f"transport.max_frame_bytes={2 * HEADER_BYTES}",
                  f"rollout.max_new_tokens={16 if quick else 32}"]  # fmt: skip
        if quick:
            common.append(f"model.path={build_tiny_model(tmp / 'tiny', ensure_embedded_base())}")
        clean, attacked = [], []
        for rep in range(reps):
            clean.append(_peak_mib(tmp, f"clean{rep}", common, attacked=False))
            attacked.append(_peak_mib(tmp, f"attacked{rep}", common, attacked=True))
    model = "tiny model" if quick else "SmolLM2-135M"
    note = (f"{model}, 1 rank, {steps} steps, {reps} runs each, {HEADER_BYTES >> 20} MiB headers "
            f"of empty maps and oversized frames; clean peaks "
            f"{', '.join(f'{m:.0f}' for m in clean)} MiB, attacked "
            f"{', '.join(f'{m:.0f}' for m in attacked)} MiB")  # fmt: skip
    return [
        report(Result.of("hostile_header_peak_memory", "MiB", clean, attacked, "baseline/ours",
                         0.95, machine(), SCENARIO.format(model=model, steps=steps), note,
                         quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    import sys

    run("--quick" in sys.argv)
