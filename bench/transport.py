"""Transport: encode + send + receive + decode of an episode batch over ZeroMQ on loopback.

Ours (msgpack header + raw array frames, zero-copy decode) against (a) the episodes pickled as
dicts of numpy arrays (protocol 5), what a user would write to ship them between processes, and
(b) a raw multipart send of the bare arrays with zero-copy receive, the practical limit. Pickle
appears here only as the baseline. (The episodes pickled as Python lists, a strawman beside (a),
are no row.) Each variant's time is its best of REPEAT runs in a round, ROUNDS rounds,
interleaved; the rows give the median round and the spread over the rounds.
"""

from __future__ import annotations

import pickle

import numpy as np
import zmq

from bench.common import Result, interleaved_rounds, machine, report
from grpo.core.episode import Episode, EpisodeBatch
from grpo.wire.codec import decode, encode_batch


def make_batch(n_episodes: int, tokens: int, prompt: int = 128, seed: int = 0) -> EpisodeBatch:
    rng = np.random.default_rng(seed)
    eps = tuple(
        Episode(
            rng.integers(0, 49152, prompt, dtype=np.int32),
            rng.integers(0, 49152, tokens, dtype=np.int32),
            rng.standard_normal(tokens, dtype=np.float32),
            rng.standard_normal(tokens, dtype=np.float32),
            float(i % 2),
            {"correct": bool(i % 2), "formatted": True},
            "length",
            i // 4,
            rollout_logp=rng.standard_normal(tokens, dtype=np.float32),
        )
        for i in range(n_episodes)
    )
    return EpisodeBatch(eps, 4, policy_version=3, seq=7)


def _pair() -> tuple[zmq.Socket, zmq.Socket]:
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")  # bound at once: no other taker
    push.connect(f"tcp://127.0.0.1:{port}")
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
    return push, pull


ARRAYS = ("prompt_ids", "completion_ids", "old_logp", "ref_logp", "rollout_logp")


def run_size(batch: EpisodeBatch, label: str, rounds: int, repeat: int,
             quick: bool) -> list[Result]:  # fmt: skip
    push, pull = _pair()

    def ours():
        push.send_multipart(encode_batch(batch), copy=False)
        return decode(pull.recv_multipart(copy=False))

    def pickled_arrays():
        rows = [{k: getattr(e, k) for k in ARRAYS} | {"reward": e.reward} for e in batch.episodes]
        push.send(pickle.dumps(rows, protocol=5))
        return pickle.loads(pull.recv())

    concatenated = [np.concatenate([getattr(e, k) for e in batch.episodes]) for k in ARRAYS]

    def raw():
        push.send_multipart([a.data for a in concatenated], copy=False)
        frames = pull.recv_multipart(copy=False)
        return [
            np.frombuffer(f.buffer, dtype=a.dtype)
            for f, a in zip(frames, concatenated, strict=True)
        ]

    # Zero copies on receive: the decoded arrays are views of the received frames.
    push.send_multipart(encode_batch(batch), copy=False)
    frames = pull.recv_multipart(copy=False)
    got = decode(frames)
    zero_copy = np.shares_memory(
        got.episodes[0].old_logp, np.frombuffer(frames[3].buffer, np.uint8)
    )
    if not zero_copy:  # the rows compare a zero-copy receive with ours: no row without it
        raise RuntimeError("decoded arrays are copies of the received frames, not views")

    times = interleaved_rounds({"ours": ours, "arrays": pickled_arrays, "raw": raw}, rounds,
                               repeat)  # fmt: skip
    push.close()
    pull.close()
    size_mb = sum(a.nbytes for a in concatenated) / 1e6
    shape = f"{len(batch.episodes)} episodes x {len(batch.episodes[0].completion_ids)} tokens"
    note = (f"{size_mb:.1f} MB of arrays; zero-copy receive: {zero_copy}; best of {repeat} "
            f"runs per round, {rounds} rounds interleaved")  # fmt: skip
    setup = (f"encode, send, receive and decode {shape} with three float32 log-prob arrays "
             f"({size_mb:.1f} MB) over ZeroMQ PUSH/PULL on loopback, in one process")  # fmt: skip
    m = machine()
    return [
        report(Result.of(f"transport_{label}_vs_pickled_arrays", "s", times["arrays"],
                         times["ours"], "baseline/ours", 2.0, m,
                         f"{setup}; baseline: the episodes as dicts of numpy arrays, "
                         "pickle.dumps(protocol=5) and pickle.loads, what a user would write "
                         "to ship them", note, quick)),
        # ratio = raw / ours: 1 is the limit; within 1.5x of it means ratio >= 1 / 1.5
        report(Result.of(f"transport_{label}_vs_raw_zero_copy", "s", times["raw"],
                         times["ours"], "baseline/ours", 1 / 1.5, m,
                         f"{setup}; baseline: a raw multipart send of the bare concatenated "
                         "arrays with zero-copy receive, no header and no checks (the practical "
                         "limit, what a user would hand-roll)", note, quick)),
    ]  # fmt: skip


def run(quick: bool = False) -> list[Result]:
    rounds, repeat = (3, 2) if quick else (5, 4)
    realistic = make_batch(8 if quick else 64, 64 if quick else 1024)
    # one 16 MB batch: 4 episodes x 250k tokens x 4 per-token arrays x 4 bytes
    big = make_batch(4, 2_500 if quick else 250_000, prompt=16)
    return (run_size(realistic, "64x1024", rounds, repeat, quick)
            + run_size(big, "16MB", rounds, repeat, quick))  # fmt: skip


if __name__ == "__main__":
    run()
