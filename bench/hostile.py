"""What a hostile local peer costs the trainer: its peak memory under the swelling-header
attack, against a clean run, and the log lines a flood of every kind of message makes it write.

A local peer sends the trainer's episode socket, for the whole run, headers of empty msgpack
maps (one byte each on the wire, a dict each if unpacked without limits: a 1 MiB header once
cost +64 MiB) and frames over `transport.max_frame_bytes`, as fast as the socket takes them
(tests/hostile_peer.py). The run is the CPU demo's (the embedded SmolLM2-135M; a tiny model
with --quick), one trainer rank; the peak is rank 0's resident set from the last metrics row.

ours: the attacked run's peak; baseline: the clean run's. Runs alternate, clean then attacked,
so drift in the machine's state favours neither; the medians are compared and the notes give
every run's peak.

The flood: the trainer's delivery endpoint and a live sampler-0 (its heartbeats only) on
loopback, in this process, and the peer sending every kind of episode-socket attack in turn
(malformed frames, misfit batches, stops in made-up and real names, a batch numbered 2**40,
heartbeats under made-up ids) for `FLOOD_S` seconds while the trainer takes batches. ours: the
lines its log got; baseline: the messages sent, the lines a log without rate limits would get.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
from pathlib import Path

from bench.common import (
    REPO,
    TINY_ENGINE,
    Result,
    free_port,
    loopback_overrides,
    machine,
    report,
    start_role,
)

CONFIG = REPO / "configs" / "cpu_demo.yaml"
HEADER_BYTES = 1 << 20
FLOOD_S = 200.0  # a repetition of the flood (--quick: 3 s)
FLOOD_LINES = 300  # the target: at most this many lines, however long the flood


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


class _Lines(logging.Handler):
    """Counts the records that reach the log, by their format string (a kind of line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.by_kind: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.by_kind[str(record.msg)] = self.by_kind.get(str(record.msg), 0) + 1


def _flood(seconds: float) -> tuple[int, _Lines]:
    """One flood; the messages sent and the lines the trainer's log got."""
    from grpo.config import TransportConfig
    from grpo.delivery.admission import Expected
    from grpo.delivery.ledger import Ledger
    from grpo.delivery.sampler_endpoint import SamplerEndpoint
    from grpo.delivery.spool import Spool
    from grpo.delivery.trainer_endpoint import TrainerEndpoint
    from tests.hostile_peer import HostilePeer

    cfg = TransportConfig(episodes_addr=f"tcp://127.0.0.1:{free_port()}",
                          control_addr=f"tcp://127.0.0.1:{free_port()}", heartbeat_s=0.5,
                          peer_timeout_s=5, startup_timeout_s=seconds + 900)  # fmt: skip
    lines, grpo_log = _Lines(), logging.getLogger("grpo")
    grpo_log.addHandler(lines)
    grpo_log.setLevel(logging.INFO)
    want = Expected(groups=4, group_size=4, arrays=frozenset({"old_logp"}), vocab_size=1 << 16)
    trainer = TrainerEndpoint(cfg, Ledger(), want, 0, max_held=64)
    with tempfile.TemporaryDirectory() as spool:
        sampler = SamplerEndpoint(cfg, "sampler-0", Spool(Path(spool), 64))
        peer = HostilePeer(cfg.episodes_addr, None, 1 << 20, pause_s=0.002)  # every kind
        done = threading.Event()  # the flood is over

        def end() -> None:
            peer.stop()
            done.set()

        threading.Timer(seconds, end).start()
        peer.start()

        def keepalive() -> None:  # called while no batch comes, as the trainer's loop does
            if done.is_set():
                raise TimeoutError

        try:  # the trainer waiting for its first batch: none it can take ever comes
            with contextlib.suppress(TimeoutError):
                trainer.next_batch(keepalive)
        finally:
            sent = peer.stop()  # already stopped, unless the trainer failed first
            sampler.close()
            trainer.close()
            grpo_log.removeHandler(lines)
    return sum(sent.values()), lines


def flood_row(quick: bool) -> Result:
    reps, seconds = (1, 3.0) if quick else (3, FLOOD_S)
    sent, written, kinds = [], [], {}
    for _ in range(reps):
        n, lines = _flood(seconds)
        sent.append(n)
        written.append(sum(lines.by_kind.values()))
        for kind, count in lines.by_kind.items():
            kinds[kind] = max(kinds.get(kind, 0), count)
    worst = sorted(kinds.items(), key=lambda kv: -kv[1])[:4]
    note = (f"{reps} floods of {seconds:g} s; messages sent {', '.join(map(str, sent))}; lines "
            f"{', '.join(map(str, written))}; the most lines of one kind: "
            + "; ".join(f"{count} x {kind[:60]!r}" for kind, count in worst))  # fmt: skip
    scenario = (f"the trainer's delivery endpoint and a live sampler on loopback, a local peer "
                f"flooding the episode socket with every kind of hostile message in turn for "
                f"{seconds:g} s; ours: lines the trainer logged; baseline: messages sent (one "
                f"line each without rate limits); target: at most {FLOOD_LINES} lines")  # fmt: skip
    return report(Result.of("hostile_flood_log_lines", "lines", sent, written, "ours<=target",
                            FLOOD_LINES, machine(), scenario, note, quick))  # fmt: skip


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
            common += [f"model.path={build_tiny_model(tmp / 'tiny', ensure_embedded_base())}",
                       TINY_ENGINE]  # fmt: skip
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
        flood_row(quick),
    ]  # fmt: skip


if __name__ == "__main__":
    import sys

    run("--quick" in sys.argv)
