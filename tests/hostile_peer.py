"""A local peer that attacks a live run's sockets with malformed input, for the soak test
(tests/test_chaos.py) and the memory benchmark (bench/hostile.py).

It connects where a sampler would and sends, round-robin, one of each kind below: noise,
truncated and over-long frames, a header of empty msgpack maps (small on the wire, large once
unpacked), batches under the real sampler's id and sequence numbers whose content is refused
(a negative or out-of-vocabulary token id, a reward or log-prob that is not a finite float32,
an empty prompt, a wrong shape), control messages with bodies of the wrong types, and
malformed requests to the weight server; and well-formed messages that a peer knowing only the
sampler's id can send: stops in its name and in made-up ones, a batch numbered 2**40, a flood of
heartbeats under made-up ids. Given `relay_addr` (weights.mode stream), it also advertises a
relay of its own there under the made-up id "0x" (which sorts first: a forger's pick) and tries
to buy that id's vouching with a batch under it, counting every request its relay is sent; given
`rendezvous_addr` (weights.mode collective), it takes seats at the group's rendezvous under
guessed keys, sets large values and malformed frames there, and opens more connections than it
serves. Nothing it sends may be trained or obeyed: impersonating a
sampler with everything it says is what CURVE keys prevent (docs/reliability.md), not
validation.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

import msgpack
import numpy as np
import zmq

from grpo.core.episode import EpisodeBatch
from grpo.wire.codec import (
    KIND_MESSAGE,
    MAGIC,
    SCHEMA_VERSION,
    Message,
    encode_batch,
    encode_message,
    seal,
)

Frames = list[bytes]


def _bad_batch(
    seq: int, spoil: Callable[[EpisodeBatch], None], groups: int = 4, sid: str = "sampler-0"
) -> Frames:
    """A batch from `sid` numbered `seq`, well-formed on the wire, spoiled in place after the
    checks a sender makes (the attacker skips them)."""
    from tests.test_episode import make_batch

    made = make_batch(seed=seq, num_groups=groups, group_size=4, rollout=False)
    batch = EpisodeBatch.from_columns(
        made.columns, 4, 0, seq, sid, {"gen_s": 1.0, "gen_tokens_per_s": 10.0}
    )
    spoil(batch)
    return [bytes(f) for f in encode_batch(batch)]


def _set(column: str, value: float) -> Callable[[EpisodeBatch], None]:
    def spoil(batch: EpisodeBatch) -> None:
        getattr(batch.columns, column)[0] = value

    return spoil


def _stat(value: float) -> Callable[[EpisodeBatch], None]:
    return lambda batch: batch.stats.update(gen_s=value)


def _empty_prompt(batch: EpisodeBatch) -> None:
    lengths = batch.columns.prompt_len  # the first prompt's tokens go to the second
    lengths[1] += lengths[0]
    lengths[0] = 0


def _no_spoil(batch: EpisodeBatch) -> None:
    pass


def empty_maps_header(size: int) -> Frames:
    """A sealed (checksum-valid) message whose header is `size` bytes of empty msgpack maps:
    one byte each on the wire, a Python dict each once unpacked."""
    return seal(b"\xdd" + size.to_bytes(4, "big") + b"\x80" * size)


def _message(kind: str, body: object) -> Frames:
    header = {"magic": MAGIC, "schema": SCHEMA_VERSION, "kind": KIND_MESSAGE, "msg_kind": kind,
              "body": body}  # fmt: skip
    return seal(msgpack.packb(header, use_bin_type=True))


def episode_attacks(rng: np.random.Generator, max_frame_bytes: int, seqs: int) -> dict:
    """Name -> a function making the next message of that kind for the episode socket."""
    real = encode_message(Message("heartbeat", {"sampler_id": "evil"}))[0]

    def seq() -> int:
        return int(rng.integers(0, seqs))

    return {
        "noise": lambda: [rng.bytes(int(rng.integers(1, 2000)))],
        "truncated": lambda: [real[: int(rng.integers(1, len(real)))]],
        "extra frame": lambda: [real, rng.bytes(64)],
        "oversized frame": lambda: [bytes(max_frame_bytes + 1)],
        "empty-maps header": lambda: empty_maps_header(max_frame_bytes // 2),
        "negative token id": lambda: _bad_batch(seq(), _set("completion_ids", -3)),
        "token id beyond the vocabulary": lambda: _bad_batch(seq(), _set("prompt_ids", 1 << 30)),
        "reward 1e39": lambda: _bad_batch(seq(), _set("reward", 1e39)),
        "NaN reward": lambda: _bad_batch(seq(), _set("reward", float("nan"))),
        "inf log-prob": lambda: _bad_batch(seq(), _set("old_logp", float("inf"))),
        "NaN stat": lambda: _bad_batch(seq(), _stat(float("nan"))),
        "empty prompt": lambda: _bad_batch(seq(), _empty_prompt),
        "wrong shape": lambda: _bad_batch(seq(), _no_spoil, groups=3),
        "heartbeat of wrong types": lambda: _message(
            "heartbeat", {"sampler_id": "sampler-0", "acked": "x", "version": [1]}
        ),
        "stop without a sampler": lambda: _message("stop", {"reason": 7}),
        # Issue 62: well-formed messages a peer that knows the sampler's id can send.
        "stop of a made-up id": lambda: _message("stop", {"sampler_id": "x-1", "reason": "x"}),
        "stop in a malformed name": lambda: _message("stop", {"sampler_id": "!", "reason": "x"}),
        "stop as the sampler from another process": lambda: _message(
            "stop", {"sampler_id": "sampler-0", "incarnation": "forged", "reason": "forged"}
        ),
        "batch of seq 2**40": lambda: _bad_batch(1 << 40, _no_spoil),
        "heartbeat of a made-up id": lambda: _message(
            "heartbeat", {"sampler_id": f"fake-{seq()}-{rng.integers(1 << 30)}", "incarnation": "f"}
        ),
        "message body not a map": lambda: _message("bye", [1, 2, 3]),
    }


def weight_attacks(rng: np.random.Generator) -> dict:
    """Name -> a function making the next malformed request for the weight server."""
    return {
        "noise": lambda: [rng.bytes(int(rng.integers(1, 500)))],
        "file a list": lambda: _message("chunk", {"version": 1, "file": [1], "offset": 0}),
        "file a map": lambda: _message("chunk", {"version": 1, "file": {}, "offset": 0}),
        "offset 2**63": lambda: _message(
            "chunk", {"version": 1, "file": "model.safetensors", "offset": 1 << 63}
        ),
        "negative offset": lambda: _message(
            "chunk", {"version": 1, "file": "model.safetensors", "offset": -5}
        ),
        "path outside": lambda: _message(
            "chunk", {"version": 1, "file": "../../LATEST", "offset": 0}
        ),
        "version a string": lambda: _message("manifest", {"version": "1"}),
        "unknown kind": lambda: _message("gimme", {"version": 1}),
    }


def relay_attacks(rng: np.random.Generator, relay_addr: str) -> dict:
    """Name -> the next message a forger sends to be told as a relay (weights.mode stream)."""
    return {
        "heartbeat advertising a forger's relay": lambda: _message(
            "heartbeat",
            {"sampler_id": "0x", "incarnation": "forger", "weights": {"relay": relay_addr}},
        ),
        # The shape is wrong: a batch that fits would be trained, which without CURVE nobody
        # can tell from a sampler's (docs/reliability.md).
        "batch under the forger's id": lambda: _bad_batch(
            int(rng.integers(0, 16)), _no_spoil, groups=3, sid="0x"
        ),
    }


def rendezvous_attacks(rng: np.random.Generator, addr: str) -> dict:
    """Name -> a function that makes one attempt on the collective group's rendezvous."""
    from grpo.config.weights import host_port
    from grpo.weights.collective.rendezvous import MAX_CONNECTIONS, RemoteStore

    def seat(key: str, value: bytes) -> Callable[[], None]:
        def attempt() -> None:
            store = RemoteStore(addr, 1.0)
            try:
                store.set(key.format(g=int(rng.integers(1, 6))), value)
            except RuntimeError:
                pass  # refused, as it must be
            finally:
                store.close_connection()

        return attempt

    def raw(data: bytes, hold: int = 1) -> Callable[[], None]:
        def attempt() -> None:
            conns = []
            try:
                for _ in range(hold):
                    conns.append(socket.create_connection(host_port(addr), 1.0))
                conns[0].sendall(data)
            except OSError:
                pass
            finally:
                for conn in conns:
                    conn.close()

        return attempt

    return {
        "seat under a guessed key": seat("generation-{g}/0/1", b"impostor"),
        "seat under a guessed secret": seat("generation-{g}-" + "0" * 32 + "/0/1", b"x"),
        "value of 60 KiB": seat("generation-{g}/0/2", bytes(60 << 10)),
        "frame declaring 8 MiB": raw(b"S\x00\x04" + (8 << 20).to_bytes(4, "big") + b"gen-"),
        "noise": raw(rng.bytes(64)),
        "connection flood": raw(b"", hold=MAX_CONNECTIONS + 8),
    }


@dataclasses.dataclass
class HostilePeer:
    """Sends the attacks above from a thread until `stop()`; `sent` counts them by
    (socket, kind)."""

    episodes_addr: str
    weights_addr: str | None
    max_frame_bytes: int
    seqs: int = 16  # sequence numbers to impersonate: the run's, and some beyond
    pause_s: float = 0.02
    only: tuple[str, ...] = ()  # send only these episode attacks (the memory benchmark)
    relay_addr: str | None = None  # where its forged relay listens (weights.mode stream)
    rendezvous_addr: str | None = None  # weights.collective_addr (weights.mode collective)
    relay_requests: int = 0  # what its relay was asked: nothing, if no forger is told
    sent: Counter = dataclasses.field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hostile-peer")

    def start(self) -> HostilePeer:
        self._thread.start()
        return self

    def stop(self) -> Counter:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.sent

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        episodes = episode_attacks(rng, self.max_frame_bytes, self.seqs)
        if self.only:
            episodes = {k: episodes[k] for k in self.only}
        weights = weight_attacks(rng) if self.weights_addr and not self.only else {}
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        dealer = ctx.socket(zmq.DEALER)
        for sock in (push, dealer):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, 1000)
            sock.setsockopt(zmq.RCVTIMEO, 0)
        push.connect(self.episodes_addr)
        if weights:
            dealer.connect(self.weights_addr)
        if self.relay_addr:
            episodes |= relay_attacks(rng, self.relay_addr)
            relay = ctx.socket(zmq.ROUTER)
            relay.setsockopt(zmq.LINGER, 0)
            relay.bind(self.relay_addr)
        plan = [("episodes", k, f) for k, f in episodes.items()]
        plan += [("weights", k, f) for k, f in weights.items()]
        if self.rendezvous_addr:
            attempts = rendezvous_attacks(rng, self.rendezvous_addr)
            plan += [("rendezvous", k, f) for k, f in attempts.items()]
        try:
            i = 0
            while not self._stop.is_set():
                where, kind, make = plan[i % len(plan)]
                i += 1
                if where == "rendezvous":
                    make()
                    self.sent[(where, kind)] += 1
                else:
                    try:
                        (push if where == "episodes" else dealer).send_multipart(make())
                        self.sent[(where, kind)] += 1
                    except zmq.Again:
                        pass
                while self.relay_addr:
                    try:
                        relay.recv_multipart(zmq.NOBLOCK)
                        self.relay_requests += 1
                    except zmq.Again:
                        break
                while weights:  # drain the server's answers, which the attack ignores
                    try:
                        dealer.recv_multipart()
                    except zmq.Again:
                        break
                time.sleep(self.pause_s)
        finally:
            push.close()
            dealer.close()
            if self.relay_addr:
                relay.close()
            ctx.term()
