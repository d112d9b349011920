"""Host buffers reused from one version to the next (grpo.weights.stream.buffers): handed out
again only once nothing but the pool holds them, so that no version's bytes are ever written
while something may still read them."""

from __future__ import annotations

import gc
import time

import numpy as np
import torch
import zmq

from grpo.weights.stream.buffers import MIN_POOLED, BufferPool
from grpo.weights.stream.torch_bits import image_from_state


def _address(buf: np.ndarray) -> int:
    return buf.ctypes.data


def test_a_buffer_is_handed_out_again_only_once_nothing_holds_it() -> None:
    """A numpy view, a torch tensor, a memoryview or a ZeroMQ frame made without a copy (what a
    server's zero-copy send holds until it is sent): while any of them lives, the buffer is not
    free; once the last is gone, it is handed out again."""
    pool = BufferPool()
    holders = {
        "numpy view": lambda b: b[10:20],
        "torch tensor": lambda b: torch.from_numpy(b[4:]).view(torch.int32),
        "memoryview": memoryview,
        "zero-copy frame": lambda b: zmq.Frame(b[: 1 << 20], copy=False),
    }
    for what, hold in holders.items():
        buf = pool.take(MIN_POOLED)
        first = _address(buf)
        holder = hold(buf)
        del buf
        other = pool.take(MIN_POOLED)
        assert _address(other) != first, f"handed out again while a {what} holds it"
        del holder, other
        deadline = time.monotonic() + 5  # pyzmq lets go of a frame's buffer on a thread of its own
        while (again := _address(pool.take(MIN_POOLED))) != first and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert again == first, f"never free again after a {what}"
    small = pool.take(1 << 20)  # glibc reuses these itself: not pooled
    assert pool.held_bytes() == 2 * MIN_POOLED and small.nbytes == 1 << 20
    pool.keep_spare(MIN_POOLED)  # one free buffer kept for the next version, the other let go
    assert pool.held_bytes() == MIN_POOLED


def test_a_version_built_from_the_pool_never_writes_a_version_still_held() -> None:
    """Versions 1 and 2 built while 1 is held: other memory, 1's bytes as they were. Version 1
    dropped, version 3 reuses its memory and holds its own bytes."""
    n = MIN_POOLED // 4 + 1  # float32: a bucket of one tensor is pooled
    state = {"a": torch.zeros(n), "b": torch.zeros(n)}
    pool = BufferPool()

    def version(v: int):
        for t in state.values():
            t.fill_(float(v))
        return image_from_state(v, state, MIN_POOLED, False, pool)

    one = version(1)
    first = {_address(f) for f in one.flats.values()}
    two = version(2)
    assert not first & {_address(f) for f in two.flats.values()}
    assert all((f.view(np.float32) == 1).all() for f in one.flats.values())
    del one
    three = version(3)
    assert {_address(f) for f in three.flats.values()} == first
    assert all((f.view(np.float32) == v).all() for v, image in ((2, two), (3, three))
               for f in image.flats.values())  # fmt: skip
