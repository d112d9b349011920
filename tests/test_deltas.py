"""grpo.weights.stream.deltas: every encoding round-trips every width of bit pattern, the
encoder picks the smallest, and a decode of anything malformed fails closed with DeltaError."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import zmq
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo.weights.stream import deltas
from grpo.weights.stream.deltas import (
    FULL,
    SPARSE,
    XOR_ZSTD,
    DeltaError,
    decode,
    encode,
)
from grpo.weights.stream.frames import bucket_sum

# torch dtype of the floats -> the int dtype of its bit patterns
FLOATS = {
    torch.float8_e4m3fn: torch.int8,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def weights(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Master weights of a layer (std 0.02, as SmolLM2's initialiser): float32, or float64
    for a float64 copy."""
    master = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=master) * 0.02


def bits(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """The published copy's bit patterns."""
    return t.to(dtype).view(FLOATS[dtype]).numpy().copy()


def adam_step(w: torch.Tensor, lr: float, seed: int = 1) -> torch.Tensor:
    """An update as Adam's first step makes it: lr times a sign, on every element."""
    g = torch.Generator().manual_seed(seed)
    return w + lr * torch.randn(w.shape, generator=g, dtype=w.dtype).sign()


def round_trip(new: np.ndarray, base: np.ndarray | None) -> deltas.Encoded:
    kept = None if base is None else base.copy()
    enc = encode(new, base)
    assert enc.nbytes <= new.nbytes
    out = decode(enc.kind, enc.parts, base, new.dtype, new.size)
    assert out.dtype == new.dtype and out.shape == (new.size,) and out.flags.writeable
    assert np.array_equal(out, new)
    assert not np.shares_memory(out, new) and (base is None or not np.shares_memory(out, base))
    if base is not None:
        assert np.array_equal(base, kept)  # untouched
    return enc


def xor_zstd_bytes(new: np.ndarray, base: np.ndarray) -> int:
    """What XOR_ZSTD costs, computed apart from the module: byte planes by a transpose."""
    planes = np.ascontiguousarray((new ^ base).view(np.uint8).reshape(new.size, new.itemsize).T)
    return len(zstandard.ZstdCompressor(level=deltas.ZSTD_LEVEL).compress(planes))


def cheapest(new: np.ndarray, base: np.ndarray) -> str:
    changed = int(np.count_nonzero(new != base))
    sizes = {FULL: new.nbytes, SPARSE: changed * (4 + new.itemsize),
             XOR_ZSTD: xor_zstd_bytes(new, base)}  # fmt: skip
    return min(sizes, key=lambda k: (sizes[k], list(sizes).index(k)))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [0, 1, 2, 5000])
def test_every_encoding_round_trips_every_width(dtype, n):
    w = weights(n, dtype)
    base = bits(w, dtype)
    moved = bits(adam_step(w, 1e-3), dtype)  # dense low-bit changes
    one = base.copy()
    one[n // 2 :: 1000] = bits(weights(n, dtype, seed=9), dtype)[n // 2 :: 1000]  # a few
    unrelated = np.random.default_rng(n).integers(-128, 128, base.nbytes, np.int8).view(base.dtype)
    kinds = set()
    for new in (base.copy(), moved, one, unrelated):
        kinds.add(round_trip(new, base).kind)
        round_trip(new, None)
    if n >= 5000:  # big enough for each to win somewhere
        assert kinds == {FULL, SPARSE, XOR_ZSTD}, kinds


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_the_encoding_chosen_is_the_cheapest(dtype):
    w = weights(20_000, dtype)
    base = bits(w, dtype)
    rng = np.random.default_rng(0)
    unrelated = rng.integers(-(2**15), 2**15, base.nbytes // 2, np.int16).view(base.dtype)
    few = base.copy()
    at = rng.choice(base.size, 20, replace=False)
    few[at] = unrelated[at]  # a handful of elements, each a whole new bit pattern
    cases = {FULL: unrelated, SPARSE: few, XOR_ZSTD: bits(adam_step(w, 1e-4), dtype)}
    for expected, new in cases.items():
        assert cheapest(new, base) == expected  # the case is what it says
        assert encode(new, base).kind == expected


def test_no_change_costs_nothing_and_full_is_the_array_itself():
    new = bits(weights(1000, torch.bfloat16), torch.bfloat16)
    same = encode(new, new.copy())
    assert same.kind == SPARSE and same.nbytes == 0
    full = encode(new, None)
    assert full.kind == FULL and full.parts[0] is new and full.nbytes == new.nbytes


def test_no_usable_base_is_full():
    new = bits(weights(1000, torch.float32), torch.float32)
    near = new.copy()
    near[0] ^= 1
    assert encode(new, near).kind == SPARSE
    for base, delta in ((None, True), (near, False), (near.view(np.int16), True),
                        (near[:-1].copy(), True)):  # fmt: skip
        assert encode(new, base, delta=delta).kind == FULL


def test_a_tie_goes_to_the_cheaper_decode():
    base = np.arange(5, dtype=np.int8)
    new = base.copy()
    new[2] = 100  # SPARSE: 4 + 1 bytes, as FULL's 5
    assert encode(new, base).kind == FULL


def test_an_incompressible_tensor_skips_compressing_the_whole(monkeypatch):
    """The probe costs a sample; a tensor whose XOR does not compress is sent FULL without
    compressing all of it, and one whose XOR does compress is still compressed whole."""
    compressed: list[int] = []
    real = deltas._compress
    monkeypatch.setattr(deltas, "_compress", lambda x: compressed.append(x.size) or real(x))
    n = 4 * deltas.PROBE_ABOVE
    rng = np.random.default_rng(0)
    base, unrelated = (rng.integers(-(2**31), 2**31, n, np.int32) for _ in range(2))
    assert encode(unrelated, base).kind == FULL
    assert max(compressed) < n
    compressed.clear()
    w = weights(n, torch.float32)
    assert encode(bits(adam_step(w, 1e-5), torch.float32), bits(w, torch.float32)).kind == XOR_ZSTD
    assert max(compressed) == n


def test_index_width():
    assert deltas.index_dtype(2**32 - 1) == np.uint32
    assert deltas.index_dtype(2**32) == np.uint64


def test_decode_takes_the_frames_a_socket_delivers():
    w = weights(3000, torch.bfloat16)
    base = bits(w, torch.bfloat16)
    news = [bits(adam_step(w, 1e-3), torch.bfloat16), base.copy(), np.flip(base).copy()]
    news[1][7] = 0
    ctx = zmq.Context.instance()
    with ctx.socket(zmq.PAIR) as a, ctx.socket(zmq.PAIR) as b:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        for new in news:
            enc = encode(new, base)
            a.send_multipart(enc.parts, copy=False)
            frames = b.recv_multipart(copy=False)
            for parts in (frames, [f.buffer for f in frames], [f.bytes for f in frames]):
                assert np.array_equal(decode(enc.kind, parts, base, base.dtype, base.size), new)


# The failures. One valid delta of each kind to break.
W = weights(4000, torch.float32)
BASE = bits(W, torch.float32)
BASE.flags.writeable = False  # a decode that wrote into its base would raise here
NEW = bits(adam_step(W, 1e-4), torch.float32)
FEW = BASE.copy()
FEW[[3, 100, 2000]] = [1, 2, 3]
ENC = {FULL: encode(NEW, None), SPARSE: encode(FEW, BASE), XOR_ZSTD: encode(NEW, BASE)}


def refused(kind: str, parts, match: str | None, base=BASE, dtype=np.int32, size=4000) -> None:
    with pytest.raises(DeltaError, match=match) as caught:
        decode(kind, parts, base, dtype, size)
    assert "\n" not in str(caught.value)  # one line


def test_the_cases_to_break_are_what_they_say():
    assert {k: e.kind for k, e in ENC.items()} == {k: k for k in ENC}
    for kind, new in ((FULL, NEW), (SPARSE, FEW), (XOR_ZSTD, NEW)):
        assert np.array_equal(decode(kind, ENC[kind].parts, BASE, np.int32, 4000), new)


def test_a_wrong_base_is_caught_by_the_checksum():
    wrong = BASE.copy()
    wrong[5] ^= 1 << 20
    for kind in (SPARSE, XOR_ZSTD):
        new = FEW if kind == SPARSE else NEW
        out = decode(kind, ENC[kind].parts, wrong, np.int32, 4000)
        assert bucket_sum([out]) != bucket_sum([new])
    assert bucket_sum([NEW]) == bucket_sum([NEW.copy()]) != bucket_sum([BASE])


@pytest.mark.parametrize("kind", [SPARSE, XOR_ZSTD])
def test_a_missing_or_misfit_base_is_refused(kind):
    parts = ENC[kind].parts
    refused(kind, parts, "needs a base", base=None)
    refused(kind, parts, "base is", base=BASE.view(np.int16))
    refused(kind, parts, "base is", base=BASE[:-1])
    refused(kind, parts, "base is", base=list(BASE))


def test_unknown_kinds_part_counts_and_targets_are_refused():
    refused("lz4", ENC[FULL].parts, "unknown encoding")
    for kind, enc in ENC.items():
        refused(kind, (*enc.parts, b""), "parts, not")
        refused(kind, enc.parts[:-1], "parts, not")
    refused(FULL, ENC[FULL].parts, "not a native signed int", dtype=np.float32)
    refused(FULL, ENC[FULL].parts, "not a native signed int", dtype=np.dtype(">i4"))
    refused(FULL, ENC[FULL].parts, "bad dtype", dtype="no such dtype")
    refused(FULL, ENC[FULL].parts, "negative size", size=-1)
    refused(FULL, ENC[FULL].parts, "bad dtype or size", size=4000.0)


def truncations(part) -> list[bytes]:
    raw = bytes(memoryview(part).cast("B"))
    return [raw[:-1], raw[: len(raw) // 2], b"", raw + b"\0"]


@pytest.mark.parametrize("kind", list(ENC))
def test_truncated_or_padded_parts_are_refused(kind):
    for i, part in enumerate(ENC[kind].parts):
        for cut in truncations(part):
            parts = list(ENC[kind].parts)
            parts[i] = cut
            refused(kind, parts, "bytes|whole|zstd")


def test_sparse_indices_out_of_range_or_not_increasing_are_refused():
    values = np.array([1, 2, 3], np.int32)
    for indices, match in (
        ([3, 100, 4000], "out of range"),
        ([3, 2000, 100], "increasing"),
        ([3, 100, 100], "increasing"),
        ([0, 1, 2**32 - 1], "out of range"),
    ):
        refused(SPARSE, (np.array(indices, np.uint32), values), match)
    refused(SPARSE, (np.array([3, 100], np.uint64), values), "bytes")  # 16 bytes: 4 uint32s


def test_a_zstd_bomb_is_refused_before_it_is_inflated():
    """A frame of 32 KB that inflates to 1 GiB, sent as a 16 KB tensor: refused
    from its header, with no allocation of what it declares; the same without a declared
    size (a streamed frame), which the encoder never sends."""
    bomb = zstandard.ZstdCompressor(level=1).compress(bytes(1 << 30))
    assert len(bomb) < 64 << 10
    refused(XOR_ZSTD, (bomb,), "declares 1073741824 bytes")
    streamed = zstandard.ZstdCompressor().compressobj()
    unsized = streamed.compress(bytes(1 << 24)) + streamed.flush()
    refused(XOR_ZSTD, (unsized,), "declares -1 bytes")


def declaring(frame: bytes, size: int) -> bytes:
    """The frame with its header's 2-byte content size (256..65791 bytes) set to `size`."""
    out = bytearray(frame)
    single_segment = (out[4] >> 5) & 1  # frame header descriptor; no window byte when set
    assert out[4] >> 6 == 1 and out[4] & 3 == 0, "a 2-byte size and no dictionary id"
    struct.pack_into("<H", out, 5 + (not single_segment), size - 256)
    return bytes(out)


def test_a_frame_that_lies_about_its_size_or_trails_data_is_refused():
    good = ENC[XOR_ZSTD].parts[0]
    sized = zstandard.ZstdCompressor(level=1).compress
    refused(XOR_ZSTD, (sized(bytes(16001)),), "declares 16001")
    lying = declaring(sized(bytes(8000)), 16000)  # declares the right size, holds half
    assert zstandard.frame_content_size(lying) == 16000
    refused(XOR_ZSTD, (lying,), "zstd frame does not decompress")
    refused(XOR_ZSTD, (good + sized(b"x"),), "zstd frame does not decompress")  # data after
    refused(XOR_ZSTD, (good[: len(good) // 2],), "zstd frame does not decompress")


@pytest.mark.parametrize("kind", [FULL, SPARSE, XOR_ZSTD])
def test_garbage_is_refused(kind):
    rng = np.random.default_rng(0)
    for n in (1, 7, 16000, 32000):
        garbage = rng.bytes(n)
        parts = [garbage] * len(ENC[kind].parts)
        if kind == FULL and n == 16000:
            continue  # any 16000 bytes are a tensor: FULL has nothing to check
        refused(kind, parts, None)
    refused(kind, [object()] * len(ENC[kind].parts), "malformed")


def test_empty_tensors_are_never_xor_zstd():
    empty = np.empty(0, np.int16)
    assert encode(empty, empty.copy()).kind == FULL
    frame = zstandard.ZstdCompressor().compress(b"")
    refused(XOR_ZSTD, (frame,), "empty tensor", base=empty, dtype=np.int16, size=0)


WIDTHS = st.sampled_from([np.int8, np.int16, np.int32, np.int64])


@st.composite
def modified(draw) -> tuple[np.ndarray, np.ndarray]:
    """A random base and a random sparse change to it: whole new bit patterns or low bits."""
    dtype = draw(WIDTHS)
    n = draw(st.integers(0, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    info = np.iinfo(dtype)
    base = rng.integers(info.min, info.max, n, dtype, endpoint=True)
    new = base.copy()
    share = draw(st.sampled_from([0.0, 0.001, 0.05, 0.5, 1.0]))
    at = rng.random(n) < share
    if draw(st.booleans()):
        new[at] = rng.integers(info.min, info.max, int(at.sum()), dtype, endpoint=True)
    else:
        new[at] ^= rng.integers(1, 8, int(at.sum()), dtype)
    return new, base


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modified())
def test_random_changes_round_trip(case):
    new, base = case
    round_trip(new, base)
