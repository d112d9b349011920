"""Weight fan-out: a streamed version from the trainer's memory to N samplers that relay it to
each other in a binary tree (grpo.weights.stream.relay.upstream, fanout 2), so the trainer's
link carries each version about once whatever N.

No model: a synthetic float32 version (real encoding, frame and tensor checksums) served by the
trainer's StreamServer, whose egress a TokenBucket limits so that one receiver takes about a
second (the trainer's uplink is the bottleneck, as between nodes; relays are not limited).
Every receiver is a RelayNode in a process of its own, on real loopback TCP sockets. Per N, over
several versions, each the first the receivers get (full copies), one row:

    time             from the trainer having the version to the last receiver holding it whole
                     and checked (target: N=64 within 2x of N=1, the median and the worst
                     case of the versions)

and in its notes the trainer copies, the trainer's egress for the version / its payload bytes.
That those stay about 1 (<= 1.2) whatever N, chaos included, is a guarantee of the relay tree,
a test (tests/test_bench_guarantees.py), not a row: its baseline, N copies, was computed.

and a chaos case: an interior relay SIGKILLed mid-version (after it took some buckets); every
other receiver must still get the version (its children route around it to their grandparent
within weights.transfer_timeout_s), and a restarted process for the killed sampler catches up
from its parent, not the trainer, whose egress must not grow by a copy.

    python -m bench.weight_fanout            # or bench.run_all --only weight_fanout
    python -m bench.weight_fanout --worker s001      # one receiver's process (the bench's)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from grpo.weights.stream.image import Image
from grpo.weights.stream.node import REQUEST_HWM, RelayNode
from grpo.weights.stream.relay import upstream
from grpo.weights.stream.server import MAX_REQUEST_BYTES, StreamServer, TokenBucket, VersionStore
from grpo.wire.channels import SocketLimits, new_socket

REPO = Path(__file__).resolve().parents[1]
MB = 1 << 20
MAX_BYTES = 64 * MB  # a receiver's bound on a version and on a bucket
FANOUT = 2


@dataclass(frozen=True)
class Shape:
    """The synthetic version, and how fast the trainer's link is."""

    tensors: int = 32
    tensor_bytes: int = 256 << 10  # 32 x 256 KiB = 8 MiB of float32
    bucket_bytes: int = 256 << 10
    seconds: float = 1.0  # for one receiver: the trainer's rate is payload / seconds

    @property
    def payload(self) -> int:
        return self.tensors * self.tensor_bytes

    @property
    def rate(self) -> float:
        return self.payload / self.seconds


def synthetic(version: int, shape: Shape) -> Image:
    """A version of float32 tensors, random per version (as bit patterns, as they travel)."""
    rng = np.random.default_rng(version)
    n = shape.tensor_bytes // 4
    tensors = [
        (f"layer.{i}.w", "float32", (n,), rng.standard_normal(n, np.float32).view(np.int32))
        for i in range(shape.tensors)
    ]
    return Image.build(version, tensors, shape.bucket_bytes)


def node_ids(n: int) -> list[str]:
    """Sampler ids that sort as their numbers do (upstream() orders the tree by id)."""
    return [f"s{i:03d}" for i in range(n)]


# --- a receiver's process: a RelayNode driven by JSON lines on stdin, answering on stdout ---


class _Out:
    """One JSON line per event, whole, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def say(self, **event: Any) -> None:
        with self.lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()


def _fetch(out: _Out, me: str, node: RelayNode, cmd: dict[str, Any]) -> None:
    version, report_after = cmd["version"], cmd.get("report_after")
    if report_after:  # the chaos case's cue to kill this process mid-version
        threading.Thread(target=_report_progress, args=(out, me, node, report_after),
                         daemon=True).start()  # fmt: skip
    try:
        image = node.receive(version, cmd["sources"], delta=False)
    except ValueError as e:
        out.say(failed=me, version=version, error=str(e))
        return
    except zmq.ContextTerminated:
        return  # the bench ended this process mid-version
    stats = node.receiver.stats
    out.say(done=me, version=version, t=time.monotonic(), digest=image.manifest.identity,
            fallbacks=dict(stats.fallbacks), bytes=stats.bytes)  # fmt: skip


def _report_progress(out: _Out, me: str, node: RelayNode, buckets: int) -> None:
    start = node.receiver.stats.progress
    while node.receiver.stats.progress - start < buckets:
        time.sleep(0.002)
    out.say(took=me, buckets=node.receiver.stats.progress - start)


def worker(me: str, timeout_s: float) -> None:
    """Sampler `me`'s relay and receiver, until stdin ends."""
    logging.getLogger("grpo.transport").setLevel(logging.ERROR)  # fallbacks are reported
    out, ctx = _Out(), zmq.Context()
    node = RelayNode.on_loopback(ctx, MAX_BYTES, timeout_s).start()
    out.say(ready=me, addr=node.addr)
    for line in sys.stdin:  # EOF: the bench is done (or gone)
        cmd = json.loads(line)
        if cmd["cmd"] == "receive":
            threading.Thread(target=_fetch, args=(out, me, node, cmd), daemon=True).start()
        elif cmd["cmd"] == "egress":
            out.say(egress=me, bytes=node.server.egress.bytes.get(cmd["version"], 0))
    node.close()
    ctx.term()


# --- the bench: the trainer's store and server here, the receivers in processes ---


class Trainer:
    """The trainer's VersionStore served at `addr`, its egress limited to `rate` bytes/s."""

    def __init__(self, ctx: zmq.Context, rate: float):
        self.store = VersionStore(keep=2, budget_bytes=1 << 30, delta=False)
        router = new_socket(ctx, zmq.ROUTER, linger_ms=0,
                            limits=SocketLimits(MAX_REQUEST_BYTES, REQUEST_HWM))  # fmt: skip
        self.addr = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
        self.closing, self.failures = threading.Event(), []
        self.server = StreamServer(router, self.store, self.closing, self.failures.append,
                                   TokenBucket(rate))  # fmt: skip
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def egress(self, version: int) -> int:
        return self.server.egress.bytes.get(version, 0)

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        if self.failures:
            raise RuntimeError(f"the trainer's server failed: {self.failures}")


class Receivers:
    """One process per receiver (each its own sampler, as the chaos case kills one): their
    relays' addresses, commands to them and events from them."""

    def __init__(self, ids: list[str], timeout_s: float):
        self.timeout_s = timeout_s
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.backlog: list[dict[str, Any]] = []  # events read that no wait has asked for yet
        self.procs: dict[str, subprocess.Popen] = {}  # sampler id -> its process
        self.readers: dict[str, threading.Thread] = {}  # sampler id -> reading its events
        self.addrs: dict[str, str] = {}
        try:
            for me in ids:
                self._spawn(me)
            self.wait("ready", len(ids), 120)
        except BaseException:
            self.close()
            raise

    def _spawn(self, me: str) -> None:
        cmd = [sys.executable, "-m", "bench.weight_fanout", "--worker", me,
               "--timeout", str(self.timeout_s)]  # fmt: skip
        self.procs[me] = subprocess.Popen(
            cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.readers[me] = threading.Thread(target=self._read, args=(self.procs[me],),
                                            daemon=True)  # fmt: skip
        self.readers[me].start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            event = json.loads(line)
            if "ready" in event:
                self.addrs[event["ready"]] = event["addr"]
            self.events.put(event)

    def send(self, ids: Iterable[str], **cmd: Any) -> None:
        for me in ids:
            self.procs[me].stdin.write(json.dumps(cmd) + "\n")
            self.procs[me].stdin.flush()

    def wait(self, key: str, count: int, timeout_s: float,
             ids: Iterable[str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """The next `count` events holding `key` (from samplers `ids`, if given); the others
        are kept for a later wait. RuntimeError on a receiver's failure or the deadline."""
        wanted = None if ids is None else set(ids)
        kept, self.backlog = self.backlog, []
        got, deadline = [], time.monotonic() + timeout_s
        while len(got) < count:
            late = f"{len(got)} of {count} {key!r} events in {timeout_s} s"
            event = kept.pop(0) if kept else self._get(deadline, late)
            if "failed" in event:
                raise RuntimeError(f"receiver {event['failed']} failed: {event['error']}")
            if key in event and (wanted is None or event[key] in wanted):
                got.append(event)
            else:
                self.backlog.append(event)
        self.backlog += kept
        return got

    def _get(self, deadline: float, late: str) -> dict[str, Any]:
        try:
            return self.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(late) from None

    def kill(self, me: str) -> list[dict[str, Any]]:
        """SIGKILL sampler `me`'s process; every event it sent before it died, now read."""
        proc = self.procs.pop(me)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.readers.pop(me).join(10)
        del self.addrs[me]
        while not self.events.empty():
            self.backlog.append(self.events.get())
        return [e for e in self.backlog if me in e.values()]

    def restart(self, me: str) -> None:
        self._spawn(me)
        self.wait("ready", 1, 60, [me])

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(BrokenPipeError):  # one that died: closed all the same
                proc.stdin.close()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def sources(ids: list[str], addrs: dict[str, str], trainer: str) -> dict[str, list[str]]:
    """Each receiver's sources, nearest first: its tree ancestors, then the trainer."""
    relays = {me: addrs[me] for me in ids}
    return {me: [*upstream(me, relays, FANOUT), trainer] for me in ids}


def announce(trainer: Trainer, rx: Receivers, ids: list[str], image: Image,
             report_after: dict[str, int]) -> float:  # fmt: skip
    """Publish `image`, have `ids` fetch it; the time it was published."""
    t0 = time.monotonic()
    trainer.store.add(image)
    for me, chain in sources(ids, rx.addrs, trainer.addr).items():
        rx.send([me], cmd="receive", version=image.version, sources=chain,
                report_after=report_after.get(me))  # fmt: skip
    return t0


def held(rx: Receivers, ids: list[str], image: Image, timeout_s: float = 120) -> list[dict]:
    """The 'done' events of `ids`, each checked to hold the trainer's version whole."""
    done = rx.wait("done", len(ids), timeout_s, ids)
    wrong = [e["done"] for e in done if e["digest"] != image.manifest.identity]
    if wrong:
        raise RuntimeError(f"{wrong} hold another version {image.version} than the trainer's")
    return done


@dataclass
class Delivery:
    """One version to N receivers."""

    n: int
    copies: float  # the trainer's egress for it / its payload
    seconds: float  # from its publishing until the last receiver held it
    fallbacks: int


def fan_out(trainer: Trainer, rx: Receivers, n: int, version: int, shape: Shape) -> Delivery:
    ids, image = node_ids(n), synthetic(version, shape)
    t0 = announce(trainer, rx, ids, image, {})
    done = held(rx, ids, image)
    fallbacks = sum(sum(e["fallbacks"].values()) for e in done)
    copies = trainer.egress(version) / image.manifest.nbytes
    return Delivery(n, copies, max(e["t"] for e in done) - t0, fallbacks)


@dataclass
class Chaos:
    n: int
    victim: str
    children: int  # the victim's, in the tree
    killed_after: int  # buckets the victim had taken
    survivors_s: float  # from publishing until the last survivor held the version
    fell_back: dict[str, int]  # survivor -> its fallbacks (each a source given up on)
    copies: float  # the trainer's egress for the version / payload, the catch-up included
    catch_up_s: float  # the restarted victim's, from its start of fetching
    catch_up_copies: float  # how much of it the trainer sent
    parent_copies: float  # how much of it the victim's parent sent


def chaos(trainer: Trainer, rx: Receivers, n: int, version: int, shape: Shape) -> Chaos:
    """SIGKILL an interior relay mid-version; the others must still get it, and its restarted
    process must catch up from its parent."""
    ids, image = node_ids(n), synthetic(version, shape)
    victim, payload = ids[1], image.manifest.nbytes  # sampler 1: children 3 and 4
    parent = ids[0]
    kill_after = max(1, len(image.manifest.buckets) // 4)
    t0 = announce(trainer, rx, ids, image, {victim: kill_after})
    took = rx.wait("took", 1, 60, [victim])[0]["buckets"]
    if any(e.get("done") == victim for e in rx.kill(victim)):
        raise RuntimeError(f"{victim} held the whole version before it was killed")
    survivors = [me for me in ids if me != victim]
    done = held(rx, survivors, image)
    fell_back = {e["done"]: sum(e["fallbacks"].values()) for e in done if e["fallbacks"]}
    before, parent_before = trainer.egress(version), egress(rx, parent, version)
    rx.restart(victim)
    t1 = time.monotonic()
    rx.send([victim], cmd="receive", version=version,
            sources=sources(ids, rx.addrs, trainer.addr)[victim])  # fmt: skip
    caught = held(rx, [victim], image)[0]
    tree = {me: me for me in ids}
    children = sum(1 for me in ids if upstream(me, tree, FANOUT)[:1] == [victim])
    return Chaos(n, victim, children, took, max(e["t"] for e in done) - t0, fell_back,
                 trainer.egress(version) / payload, caught["t"] - t1,
                 (trainer.egress(version) - before) / payload,
                 (egress(rx, parent, version) - parent_before) / payload)  # fmt: skip


def egress(rx: Receivers, me: str, version: int) -> int:
    """What sampler `me`'s relay has sent of `version`."""
    rx.send([me], cmd="egress", version=version)
    return rx.wait("egress", 1, 30, [me])[0]["bytes"]


QUICK = Shape(tensors=16, tensor_bytes=128 << 10, bucket_bytes=128 << 10, seconds=0.5)
TIMEOUT_S = 1.0  # weights.transfer_timeout_s: a silent source is passed over after it


def _spread(values: list[float], digits: int = 2) -> str:
    """Median (min-max)."""
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")  # fmt: skip


@contextmanager
def network(shape: Shape, n: int) -> Iterator[tuple[Trainer, Receivers]]:
    """The trainer's server and `n` receivers, one process each, started once."""
    ctx = zmq.Context()
    trainer = Trainer(ctx, shape.rate)
    try:
        rx = Receivers(node_ids(n), TIMEOUT_S)
        try:
            yield trainer, rx
        finally:
            rx.close()
    finally:
        trainer.close()
        ctx.term()


def measure(shape: Shape, sizes: tuple[int, ...], reps: int,
            chaos_n: int) -> tuple[dict[int, list[Delivery]], Chaos]:  # fmt: skip
    """`reps` versions to each N (the Ns interleaved, so that drift favours none), then the
    chaos case."""
    with network(shape, max(*sizes, chaos_n)) as (trainer, rx):
        runs: dict[int, list[Delivery]] = {n: [] for n in sizes}
        version = 0
        for _ in range(reps):
            for n in sizes:
                version += 1
                runs[n].append(fan_out(trainer, rx, n, version, shape))
        return runs, chaos(trainer, rx, chaos_n, version + 1, shape)


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{me} {count}" for me, count in sorted(counts.items())) or "none"


def _notes(shape: Shape, runs: dict[int, list[Delivery]], c: Chaos,
           load: float) -> tuple[str, str, str]:  # fmt: skip
    """What each row's one number leaves out: every N's median and spread, the set-up."""
    most, reps = max(runs), len(runs[1])
    setup = (f"{shape.payload / MB:g} MiB float32 version in "
             f"{shape.payload // shape.bucket_bytes} buckets, trainer link "
             f"{shape.rate / MB:.1f} MiB/s, binary tree of relays, one process per receiver, "
             f"{reps} versions per N (full copies), median (min-max); load average "
             f"{load:.1f} before the run")  # fmt: skip
    copies = ", ".join(f"N={n} {_spread([d.copies for d in ds], 3)}" for n, ds in runs.items())
    seconds = ", ".join(f"N={n} {_spread([d.seconds for d in ds])}" for n, ds in runs.items())
    fallbacks = sum(d.fallbacks for ds in runs.values() for d in ds)
    return (
        f"trainer egress / payload: {copies}; baseline = N={most} copies (each receiver from "
        f"the trainer); {setup}",
        f"publish to last receiver holding it, s: {seconds}; ours = N={most}, baseline = N=1; "
        f"{fallbacks} fallbacks; {setup}",
        f"N={c.n}, {c.victim} ({c.children} children) SIGKILLed after {c.killed_after} buckets: "
        f"the {c.n - 1} others held the version {c.survivors_s:.2f} s after publishing "
        f"(fallbacks: {_listed(c.fell_back)}); the restarted {c.victim} caught up in "
        f"{c.catch_up_s:.2f} s, {c.parent_copies:.2f} copies from its parent, "
        f"{c.catch_up_copies:.3f} from the trainer; ours = trainer egress / payload for the "
        f"version, baseline = N copies; {setup}",
    )


def run(quick: bool = False) -> list:
    from bench.common import Result, machine, report

    shape = QUICK if quick else Shape()
    sizes = (1, 4) if quick else (1, 4, 16, 64)
    load = os.getloadavg()[0]  # other programs' share of the 2 cores shows in the times
    runs, c = measure(shape, sizes, reps=2 if quick else 5, chaos_n=4 if quick else 16)
    most = max(sizes)
    where, (copies_note, time_note, chaos_note) = machine(), _notes(shape, runs, c, load)
    scenario = (f"a synthetic {shape.payload / MB:g} MiB float32 version streamed from the "
                f"trainer's memory, its link limited to {shape.rate / MB:.1f} MiB/s, to N "
                "receivers in processes of their own relaying it in a binary tree over "
                f"loopback TCP; ours: N={most} receivers; baseline: N=1, the same version to "
                "one receiver (the time a fan-out that scaled perfectly would keep)")  # fmt: skip
    # target (the issue's): the most receivers hold it within 2x of the time one does
    return [
        report(Result.of("weight_fanout_time_vs_one_receiver", "s",
                         [d.seconds for d in runs[1]], [d.seconds for d in runs[most]],
                         "baseline/ours", 0.5, where, scenario,
                         f"{time_note}; {copies_note}; chaos: {chaos_note}", quick)),
    ]  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.weight_fanout")
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's)")
    parser.add_argument("--worker", help="run as this receiver's process (driven on stdin)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.timeout)
    else:
        run(args.quick)
