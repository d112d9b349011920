"""Chaos tests: real roles started as on separate nodes (ROLE=trainer / ROLE=sampler), then
killed with SIGKILL mid-run, restarted with --resume, or fed garbage. The ledger must show every
batch the sampler produced trained exactly once, and the dataset positions must continue with
no repeat and no gap."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.common import descendants, free_port, kill_tree, start_role
from grpo.runtime.lifetime import alive
from grpo.weights.collective.rendezvous import MAX_CONNECTIONS
from tests.conftest import PYTHON, transport_overrides
from tests.test_integration import _assert_no_stray_processes, tiny_config

pytestmark = pytest.mark.slow

TOTAL = 8


def start(
    role: str, config: Path, overrides: list[str], log: Path, env: dict | None = None
) -> subprocess.Popen:
    return start_role(role, config, overrides, log, env={"PYTHON": PYTHON, **(env or {})})


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def wait_for(cond, what: str, procs: list[subprocess.Popen], timeout: float = 400) -> float:
    started = time.monotonic()
    while not cond():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        for p in procs:
            assert p.poll() is None, f"a role exited early ({p.returncode}) waiting for {what}"
        time.sleep(0.3)
    return time.monotonic() - started


def finish(procs: list[subprocess.Popen], timeout: float = 500) -> None:
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)


def assert_exactly_once(run_dir: Path, spool: Path, log_text: str) -> list[dict]:
    """Steps 1..TOTAL once each; batches 0..TOTAL-1 once each; question ranges contiguous."""
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == list(range(1, TOTAL + 1)), [r["step"] for r in rows]
    by_seq = sorted(rows, key=lambda r: r["batch_seq"])
    assert [r["batch_seq"] for r in by_seq] == list(range(TOTAL))
    ranges = [(r["sampler_data_start"], r["sampler_data_end"]) for r in by_seq]
    assert ranges[0][0] == 0, ranges
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    # Every batch was sent exactly once as a new batch (resends are not regenerations), and
    # everything was acknowledged.
    sent = [int(s) for s in re.findall(r"sent batch (\d+)", log_text)]
    assert sorted(sent) == list(range(TOTAL)), sent
    assert sorted(p.name for p in spool.iterdir()) == ["state.json"]
    return rows


def _is_rank(pid: int) -> bool:
    """A live trainer rank (training_worker.py), not a zombie."""
    try:
        return alive(pid) and b"training_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def setup(
    tmp_path: Path, tiny_model_dir: Path, ranks: int = 2
) -> tuple[Path, list[str], Path, Path]:
    """A run of TOTAL steps that saves its state every 2; `ranks` 1 where the trainer's ranks
    are not the subject (each rank is seconds of start-up on CPU)."""
    config = tiny_config(
        tmp_path,
        tiny_model_dir,
        train={"total_steps": TOTAL, "state_interval": 2, "resume": "auto", "num_ranks": ranks},
    )
    # The peers must outlive each other's restart (tens of seconds here).
    overrides = transport_overrides(timeout_s=240)
    return config, overrides, tmp_path / "runs" / "tiny", tmp_path / "runs/spool/tiny/sampler-0"


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_model_dir) -> Path:
    """The crash tests' run (setup()), once straight through: what a crashed and resumed run
    must end with, weights and all, and the finished run the resume refusals start from (the
    tests that use it share one xdist worker, so this is one run for all)."""
    tmp = tmp_path_factory.mktemp("straight")
    config, overrides, run_dir, _ = setup(tmp, tiny_model_dir)
    both = start("both", config, overrides, tmp / "both.log")
    finish([both])
    assert both.returncode == 0, (tmp / "both.log").read_text()[-3000:]
    return run_dir


def assert_same_as_straight(run_dir: Path, straight: Path) -> float:
    """The same data order, rewards and optimizer steps at every step, and the same final
    weights, bit for bit: the runs sample with the same seeds from the same weights, and a
    resume restores the weights, the optimizer, the scheduler and every RNG. Returns the
    largest weight difference (0.0)."""
    from safetensors.torch import load_file

    keys = ("batch_seq", "sampler_data_start", "sampler_data_end", "reward_mean",
            "completion_lens", "optimizer_steps", "loss", "grad_norm")  # fmt: skip
    for got, want in zip(rows_of(run_dir), rows_of(straight), strict=True):
        assert {k: got[k] for k in keys} == {k: want[k] for k in keys}, (got["step"], got, want)
    final = f"versions/v{TOTAL:06d}/model.safetensors"
    got, want = load_file(run_dir / final), load_file(straight / final)
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert got.keys() == want.keys() and diff == 0.0, diff
    return diff


def kill_and_restart(
    victim: str, procs: dict[str, subprocess.Popen], start_again, run_dir: Path
) -> tuple[int, float]:
    """SIGKILL `victim` (a role of `procs`) and start it again with `start_again(victim)`;
    (the steps done before the kill, the seconds from the kill to the next step).

    The sampler is killed with everything it started; the trainer's launcher alone (kill -9 of
    one pid, as the OOM killer does it): its ranks, in sessions of their own, must die with it,
    or the restarted trainer would find its ports taken."""
    if victim == "trainer":
        ranks = [p for p in descendants(procs[victim].pid) if _is_rank(p)]
        assert len(ranks) == 2, "the trainer's two ranks, before the kill"
        procs[victim].kill()
        procs[victim].wait()
        gone = wait_for(
            lambda: not any(_is_rank(p) for p in ranks), "the ranks to die", [], timeout=30
        )
        print(f"\nchaos/trainer: both ranks died {gone:.1f} s after their launcher's SIGKILL")
    else:
        kill_tree(procs[victim])
    killed_at, steps_before = time.time(), len(rows_of(run_dir))
    procs[victim] = start_again(victim)
    recover_s = wait_for(
        lambda: any(r["time"] > killed_at for r in rows_of(run_dir)),
        f"a step after the {victim}'s restart",
        list(procs.values()),
    )
    return steps_before, recover_s


def weights_overrides(mode: str) -> list[str]:
    """How versions travel in a crash test: shared_dir (the straight run's way), or from the
    trainer's memory over fresh ports (stream, collective)."""
    if mode == "shared_dir":
        return []
    return [f"weights.mode={mode}", f"transport.weights_addr=tcp://127.0.0.1:{free_port()}",
            f"weights.collective_addr=tcp://127.0.0.1:{free_port()}",
            "weights.collective_timeout_s=5"]  # fmt: skip


# The stream variant is in the extended tier (tests/conftest.py): serving and fetching versions
# from memory, test_weight_streaming.py. So is the shared_dir one: CI's
# test_launch_sh_heals_a_sigkilled_sampler_and_trainer_rank kills and resumes both roles of a
# shared_dir run and ends bit for bit as the straight run, and the collective variant here
# keeps the two crashes in one run.
STREAM = pytest.param("stream", marks=pytest.mark.extended)
SHARED_DIR = pytest.param("shared_dir", marks=pytest.mark.extended)


@pytest.mark.xdist_group("crash_tests")  # with the others, so straight_run runs once
@pytest.mark.parametrize("weights", [SHARED_DIR, STREAM, "collective"])
def test_a_sigkilled_trainer_then_sampler_resume_and_train_every_batch_exactly_once(
    tmp_path, tiny_model_dir, straight_run, weights
):
    """One run, two crashes (each had a run of its own before): after step 3 (the state of
    step 2 saved, batch 2 trained but not durable) the trainer's launcher is SIGKILLed and
    started again, both ranks' ZeRO-2 shards resumed; after step 5 the sampler is SIGKILLed and
    restarted with --resume. Every batch is trained exactly once, the dataset goes on with no
    repeat and no gap, and the run ends where the straight one does. With versions on disk
    (the straight run's way) and streamed from the trainer's memory, which a restarted
    trainer refills from its saved state."""
    config, overrides, run_dir, spool = setup(tmp_path, tiny_model_dir)
    overrides = [*overrides, *weights_overrides(weights)]
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "sampler")}
    procs = {role: start(role, config, overrides, logs[role]) for role in logs}
    restart = {"trainer": [], "sampler": ["--resume"]}

    def start_again(role: str) -> subprocess.Popen:
        return start(role, config, [*overrides, *restart[role]], logs[role])

    try:
        wait_for(lambda: len(rows_of(run_dir)) >= 3, "step 3", list(procs.values()))
        trainer_before, trainer_recover_s = kill_and_restart("trainer", procs, start_again, run_dir)
        wait_for(lambda: len(rows_of(run_dir)) >= 5, "step 5", list(procs.values()))
        first_sampler_log = len(logs["sampler"].read_text())
        sampler_before, sampler_recover_s = kill_and_restart("sampler", procs, start_again, run_dir)
        finish(list(procs.values()))
    finally:
        finish(list(procs.values()), timeout=1)
    text = {r: p.read_text() for r, p in logs.items()}
    assert all(p.returncode == 0 for p in procs.values()), (
        text["trainer"][-3000:] + text["sampler"][-3000:]
    )
    rows = assert_exactly_once(run_dir, spool, text["sampler"])
    _assert_no_stray_processes(config)
    diff = assert_same_as_straight(run_dir, straight_run)
    if weights != "shared_dir":  # every version came from the trainer's memory, none from a dir,
        assert "(streamed)" in text["sampler"] and "reloaded weights" not in text["sampler"]
        assert rows[-1]["sampler_weights_received_mb"] > 0
        # and the only version dir is the last step's (weights.save_interval: 0)
        assert [p.name for p in (run_dir / "versions").iterdir()] == [f"v{TOTAL:06d}"]
    if weights == "collective":  # half or more by broadcast: by stream what a rejoin missed
        grouped = set(re.findall(r"version (\d+) from the collective group", text["sampler"]))
        streamed = set(re.findall(r"weights: version (\d+) from tcp://", text["sampler"]))
        # and some versions the sampler loaded came by broadcast alone, never streamed
        loaded = set(re.findall(r"loaded weights: version \d+ -> (\d+)", text["sampler"]))
        assert len(grouped) >= TOTAL // 2 and loaded - streamed, (grouped, streamed, loaded)
        # The restarted sampler rejoined: a group formed after its kill. (Whether the restarted
        # trainer formed one before it is a race: the resent batches train within a second.)
        firsts = re.findall(r"collective group \d+ formed with .* \(versions from (\d+) on\)",
                            text["trainer"])  # fmt: skip
        assert firsts and int(firsts[-1]) > sampler_before, firsts

    # The trainer resumed from the last saved state, before the step it was killed after, and
    # the sampler (the first one) noticed.
    m = re.search(r"resumed from .* at step (\d+)", text["trainer"])
    assert m and int(m[1]) % 2 == 0 and int(m[1]) < trainer_before, text["trainer"][-3000:]
    first, second = text["sampler"][:first_sampler_log], text["sampler"][first_sampler_log:]
    assert "the trainer restarted" in first
    # The restarted sampler resumed from its spool: a batch the killed one was generating is
    # made by its successor (same questions); spooled ones are resent, not regenerated.
    assert "resuming at batch" in second, second[-3000:]
    sent = [int(s) for s in re.findall(r"sent batch (\d+)", text["sampler"])]
    assert len(sent) == len(set(sent)) == TOTAL, sent
    print(
        f"\nchaos: produced {TOTAL}, trained {len(rows)}, trainer killed after step "
        f"{trainer_before} and resumed at step {m[1]} (first step after the kill in "
        f"{trainer_recover_s:.0f} s), sampler killed after step {sampler_before} (first step "
        f"after the kill in {sampler_recover_s:.0f} s), duplicates dropped "
        f"{rows[-1]['duplicates_dropped']}, lost 0; final weights vs the straight run: "
        f"max |diff| {diff}"
    )


def _sigkill(pid: int) -> None:
    """SIGKILL one process and everything it started."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _role_pid(launcher: subprocess.Popen, script: str) -> int:
    """The process of launch.sh's that runs `script` (its newest, after a restart)."""
    pids = [p for p in descendants(launcher.pid)
            if alive(p) and script.encode() in Path(f"/proc/{p}/cmdline").read_bytes()]  # fmt: skip
    assert pids, f"no {script} under launch.sh"
    return max(pids)


@pytest.mark.xdist_group("crash_tests")  # with the crash tests: one straight run for all
def test_launch_sh_heals_a_sigkilled_sampler_and_trainer_rank(
    tmp_path, tiny_model_dir, straight_run
):
    """Under launch.sh's supervision (both roles, one process): after step 3 the sampler is
    SIGKILLed, after step 5 one trainer rank. launch.sh restarts each (train.resume=auto): the
    sampler resumes from its spool while the trainer waits; the trainer from its last saved
    state while the sampler keeps its spool and reconnects. The run ends as the straight one
    does, bit for bit, each batch trained once, and the metrics row counts the restarts."""
    config, overrides, run_dir, spool = setup(tmp_path, tiny_model_dir)
    log = tmp_path / "both.log"
    both = start("both", config, overrides, log, env={"GRPO_RESTART_DELAY_S": "1"})
    try:
        wait_for(lambda: len(rows_of(run_dir)) >= 3, "step 3", [both])
        killed_at = time.time()
        _sigkill(_role_pid(both, "sampling_worker.py"))

        def trained_since() -> int:
            return sum(r["time"] > killed_at for r in rows_of(run_dir))

        wait_for(lambda: trained_since() >= 2 and len(rows_of(run_dir)) >= 5,
                 "step 5, two steps after the sampler's kill", [both])  # fmt: skip
        os.kill(_role_pid(both, "training_worker.py"), signal.SIGKILL)  # one rank of two
        finish([both])
    finally:
        finish([both], timeout=1)
    text = log.read_text()
    assert both.returncode == 0, text[-4000:]
    for role in ("sampler", "trainer"):
        assert f"launch.sh: the {role} exited with code" in text and "(restart 1 of 3)" in text
    rows = assert_exactly_once(run_dir, spool, text)
    assert rows[-1]["trainer_restarts"] == 1 and rows[-1]["sampler_restarts"] == 1, rows[-1]
    diff = assert_same_as_straight(run_dir, straight_run)
    _assert_no_stray_processes(config)
    print(
        f"\nhealed: sampler and trainer rank SIGKILLed, each restarted once; final weights vs "
        f"the straight run: max |diff| {diff}"
    )


@pytest.mark.xdist_group("crash_tests")  # with the crash tests: one straight run for all
@pytest.mark.parametrize(
    "weights",
    [
        "files",
        pytest.param("stream", marks=pytest.mark.extended),
        pytest.param("collective", marks=pytest.mark.extended),
    ],
)
def test_a_run_under_attack_ends_as_a_clean_run(tmp_path, tiny_model_dir, straight_run, weights):
    """The soak test: for the whole run a local peer sends malformed batches under the real
    sampler's id and sequence numbers, noise, truncated and oversized frames, headers that
    swell when unpacked, control messages of the wrong types, malformed weight requests, and
    well-formed stops, heartbeats and batches a peer knowing the sampler's id can send
    (tests/hostile_peer.py). The run completes, every batch trained once, and its weights
    equal the straight run's bit for bit: nothing the peer sent was trained, counted as seen
    or obeyed. Samplers fetch weights over ZeroMQ here, so the weight server is attacked
    while it serves the real sampler: files fetched (files), versions streamed from the
    trainer's memory while the peer advertises a relay of its own under a made-up id
    (stream), or broadcast while it tries to take seats at the group's rendezvous
    (collective)."""
    from tests.hostile_peer import HostilePeer

    config, overrides, run_dir, spool = setup(tmp_path, tiny_model_dir)
    weights_addr = f"tcp://127.0.0.1:{free_port()}"
    max_frame = 1 << 20
    overrides = [*overrides, f"transport.max_frame_bytes={max_frame}",
                 f"transport.weights_addr={weights_addr}"]  # fmt: skip
    if weights != "files":
        overrides += [o for o in weights_overrides(weights) if "weights_addr" not in o]
    collective_addr = next((o.split("=", 1)[1] for o in overrides
                            if o.startswith("weights.collective_addr")), None)  # fmt: skip
    addr = next(o.split("=", 1)[1] for o in overrides if o.startswith("transport.episodes_addr"))
    # The sampler as on a node of its own: its own output dir, weights fetched from the server.
    node = tmp_path / "sampler-node"
    spool = node / "spool/tiny/sampler-0"
    logs = {role: tmp_path / f"{role}.log" for role in ("trainer", "sampler")}
    procs = [
        start("trainer", config, overrides, logs["trainer"]),
        start("sampler", config, [*overrides, f"output_dir={node}"], logs["sampler"]),
    ]
    peer = HostilePeer(
        addr, weights_addr, max_frame,
        relay_addr=f"tcp://127.0.0.1:{free_port()}" if weights == "stream" else None,
        rendezvous_addr=collective_addr if weights == "collective" else None,
    ).start()  # fmt: skip
    try:
        finish(procs, timeout=600)
    finally:
        sent = peer.stop()
    trainer, sampler = (logs[role].read_text() for role in ("trainer", "sampler"))
    assert all(p.returncode == 0 for p in procs), trainer[-3000:] + sampler[-3000:]
    took = {"files": r"fetched (weights|version)", "stream": r"version \d+ from tcp://",
            "collective": r"version \d+ from the collective group"}[weights]  # fmt: skip
    assert re.search(took, sampler), sampler[-3000:]
    assert peer.relay_requests == 0  # the forger's relay was never told to the sampler
    rows = assert_exactly_once(run_dir, spool, sampler)
    diff = assert_same_as_straight(run_dir, straight_run)
    assert rows[-1]["rejected_frames"] > 0 and rows[-1]["rejected_batches"] > 0
    assert "dropped a malformed frame" in trainer
    # Each kind of refusal is logged the first ten times and at every power of two after: a
    # flood costs the log a few dozen lines (4,470 in 4 steps when each had its own).
    last = rows[-1]
    refused = last["rejected_frames"] + last["rejected_batches"] + last["refused_messages"]
    cap = 3 * (10 + refused.bit_length())  # three kinds, each at most this many lines
    lines = len(re.findall(r"dropped a malformed frame|refused a message|dropped batch", trainer))
    assert lines <= cap < refused, (refused, lines)
    seats = sum(n for (where, _), n in sent.items() if where == "rendezvous")
    seat_lines = len(re.findall(r"collective rendezvous (refused|turned away)", trainer))
    if weights == "collective":  # each of the rendezvous' two kinds of refusal, as few lines
        assert 0 < seat_lines <= 2 * (10 + (seats * (MAX_CONNECTIONS + 8)).bit_length())
    assert all(n > 0 for n in sent.values()) and len(sent) >= 20, sent
    counts = ", ".join(f"{where}/{kind} {n}" for (where, kind), n in sorted(sent.items()))
    print(f"\nchaos/soak ({weights}): sent {sum(sent.values())} hostile messages ({counts}); "
          f"{rows[-1]['rejected_frames']} malformed frames and {rows[-1]['rejected_batches']} "
          f"misfit batches rejected by the last step; {lines} lines for them, {seat_lines} for "
          f"{seats} attempts on the rendezvous; final weights vs the straight run: "
          f"max |diff| {diff}")  # fmt: skip
    _assert_no_stray_processes(config)


@pytest.mark.xdist_group("crash_tests")  # a copy of straight_run is its finished run
def test_resume_refuses_another_world_size_or_dataset(tmp_path, tiny_model_dir, straight_run):
    """A finished run resumed with another trainer world size or data order is refused by
    name. (Resumed as it was, it has nothing left to do: tests/test_zero3.py's offload run.)"""
    config, overrides, run_dir, _ = setup(tmp_path, tiny_model_dir)
    # The straight run's outputs (run dir and spool) as this config's: a finished run of
    # TOTAL steps on 2 ranks with shuffled data, which each refusal below must recognise.
    shutil.copytree(straight_run.parent, run_dir.parent)
    refusals = {
        "trainer": ("train.num_ranks=1", "saved with world=2, this run has world=1"),
        "sampler": ("data.shuffle=false", "saved with shuffle=True, this run has shuffle=False"),
    }  # each refuses before it connects, so both start at once (one start-up's wait)
    procs = {role: start(role, config, [*overrides, change, "--resume"], tmp_path / f"{role}.log")
             for role, (change, _) in refusals.items()}  # fmt: skip
    finish(list(procs.values()), timeout=300)
    for role, (_, message) in refusals.items():
        log = (tmp_path / f"{role}.log").read_text()
        assert procs[role].returncode != 0, log[-3000:]  # torchrun turns 2 into 1
        assert message in log
    assert [r["step"] for r in rows_of(run_dir)] == list(range(1, TOTAL + 1))  # left alone


@pytest.mark.extended  # CI leaves it out; the shape check itself: test_admission.py
def test_a_sampler_with_another_batch_shape_is_stopped_by_name(tmp_path, tiny_model_dir):
    """The trainer drops the misfit batch and tells the sampler, which stops saying why; its
    stop then ends the trainer, the only way the run could go on being a silent wait."""
    config, _, run_dir, _ = setup(tmp_path, tiny_model_dir, ranks=1)
    overrides = transport_overrides(timeout_s=60)
    logs = {r: tmp_path / f"{r}.log" for r in ("trainer", "sampler")}
    trainer = start("trainer", config, overrides, logs["trainer"])
    fewer = [*overrides, "rollout.questions_per_step=2"]
    sampler = start("sampler", config, fewer, logs["sampler"])
    finish([trainer, sampler], timeout=300)
    text = {r: p.read_text() for r, p in logs.items()}
    assert sampler.returncode != 0 and trainer.returncode != 0, text
    why = "it has 2 groups of 4, but the trainer expects 4 groups of 4"
    assert f"the trainer rejected batch 0: {why}" in text["sampler"]
    assert f"dropped batch 0 from sampler-0 (1 so far): {why}" in text["trainer"]
    assert f"sampler sampler-0 stopped: the trainer rejected batch 0: {why}" in text["trainer"]
    assert not rows_of(run_dir)
