"""Streamed versions (weights.mode: stream) over real sockets: a trainer's store and relays
serving, receivers taking versions by delta or whole, and every way of failing closed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgpack
import numpy as np
import pytest
import zmq

from grpo.weights.stream.client import VersionFetcher
from grpo.weights.stream.frames import FULL_COPY, decode_bucket
from grpo.weights.stream.image import ApplyError, Image, Staging, encode_image_bucket
from grpo.weights.stream.relay import RelaySource, upstream
from grpo.weights.stream.server import StreamServer, VersionStore
from grpo.wire.codec import FrameError, seal

MB = 1 << 20


def model(version: int, seed: int = 0, changed: float = 0.02) -> Image:
    """A float32 'model' of a few tensors; each version changes `changed` of the elements."""
    rng = np.random.default_rng(seed)
    shapes = {"embed": (256, 64), "layer.0.w": (64, 64), "layer.0.b": (64,), "head": (64, 300)}
    tensors = []
    for name, shape in shapes.items():
        x = rng.standard_normal(shape).astype(np.float32).ravel()
        for v in range(1, version + 1):
            step = np.random.default_rng((seed, v, len(name))).random(x.size) < changed
            x = x.copy()
            x[step] += np.float32(1e-3)
        tensors.append((name, "float32", shape, x.view(np.int32)))
    return Image.build(version, tensors, bucket_bytes=40_000)


@contextmanager
def serving(source, ctx: zmq.Context) -> Iterator[str]:
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    closing = threading.Event()
    failures: list[str] = []
    server = StreamServer(router, source, closing, failures.append)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        closing.set()
        thread.join(5)
    assert not failures


def same(a: Image, b: Image) -> bool:
    return a.manifest == b.manifest and all(
        np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays
    )


@pytest.fixture()
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.term()


def test_a_version_arrives_whole_then_by_delta(ctx: zmq.Context) -> None:
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(model(1))
    with serving(store, ctx) as addr:
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5)
        v1 = rx.receive([addr], 1, None)
        full_bytes = rx.stats.bytes
        store.add(model(2))
        v2 = rx.receive([addr], 2, v1)
    assert same(v1, model(1)) and same(v2, model(2))
    assert rx.stats.bytes - full_bytes < 0.3 * full_bytes  # the delta, not a second copy
    assert not rx.stats.fallbacks


def test_a_base_the_trainer_dropped_falls_back_to_full_copies(ctx: zmq.Context) -> None:
    store = VersionStore(keep=1, budget_bytes=64 * MB)
    store.add(model(3))
    with serving(store, ctx) as addr:
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5)
        got = rx.receive([addr], 3, model(1))
    assert same(got, model(3))
    assert rx.stats.fallbacks["base not kept"] == len(got.manifest.buckets)


def test_a_wrong_base_fails_its_checksum_and_is_fetched_whole(ctx: zmq.Context) -> None:
    """The receiver claims version 1 but holds other weights (drifted): every delta's result
    fails its tensor's checksum, nothing wrong is staged, the full copies make it right."""
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(model(1))
    store.add(model(2))
    drifted = model(1, seed=7)
    drifted = Image(model(1).manifest, drifted.arrays)
    with serving(store, ctx) as addr:
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5)
        got = rx.receive([addr], 2, drifted)
    assert same(got, model(2))
    assert rx.stats.fallbacks["delta mismatch"] == len(got.manifest.buckets)


def test_staging_refuses_a_corrupted_bucket_and_keeps_nothing_of_it() -> None:
    new, base = model(2), model(1)
    frames, _ = encode_image_bucket(new, 0, base)
    staging = Staging(new.manifest)
    payload = bytearray(frames[1])
    payload[len(payload) // 2] ^= 0x40
    with pytest.raises(Exception, match="checksum"):
        decode_bucket([frames[0], bytes(payload), *frames[2:]], 64 * MB)
    # The frames intact but the delta applied to another base: refused by the tensor digest.
    bucket = decode_bucket(frames, 64 * MB)
    other = Image(base.manifest, model(1, seed=3).arrays)
    with pytest.raises(ApplyError, match="checksum"):
        staging.apply(bucket, other)
    assert staging.arrays == {} and staging.missing() == list(range(len(new.manifest.buckets)))
    with pytest.raises(ApplyError, match="never arrived"):
        staging.finish()


@pytest.mark.parametrize("bucket_bytes", [1 << 20, 1], ids=["one bucket", "one each"])
def test_a_full_copy_bucket_is_its_tensors_back_to_back_in_a_buffer_of_its_own(
    bucket_bytes: int,
) -> None:
    """image_from_state copies each bucket once into a buffer of its own (the trainer steps on
    while it is served) and that buffer is the bucket's one payload frame; a receiver's staged
    arrays are views of the payload it received, the same bits whatever the dtypes, a narrower
    odd-sized tensor before a wider one included."""
    import torch

    from grpo.weights.stream.torch_bits import image_from_state, state_from_image

    state = {
        "w": torch.randn(3, 5),
        "half": torch.randn(3).to(torch.bfloat16),  # 6 bytes: the next tensor sits unaligned
        "b": torch.randn(7),
        "mask": torch.tensor([True, False, True]),
    }
    image = image_from_state(4, state, bucket_bytes, False)
    before = {name: t.clone() for name, t in state.items()}
    buckets = range(len(image.manifest.buckets))
    frames = [encode_image_bucket(image, i, None)[0] for i in buckets]
    assert all(len(f) == 2 for f in frames)
    joined = [b"".join(image.arrays[s.name].tobytes() for s in image.manifest.bucket_specs(i))
              for i in buckets]  # fmt: skip
    assert [bytes(f[1]) for f in frames] == joined
    for t in state.values():  # the trainer's next step
        t.bitwise_not_() if t.dtype == torch.bool else t.add_(1)
    assert [bytes(encode_image_bucket(image, i, None)[0][1]) for i in buckets] == joined

    # A socket's buffer (writable, received for this receiver alone) is staged as it is, its
    # tensors views of it; a read-only one (a relay's bytes) is copied once.
    for writable in (True, False):
        staging, received = Staging(image.manifest), []
        for header, payload in frames:
            received.append(bytearray(payload) if writable else bytes(payload))
            staging.apply(decode_bucket([bytes(header), received[-1]], 64 * MB), None)
        got = staging.finish()
        views = [np.shares_memory(got.flats[i], np.frombuffer(received[i], np.uint8))
                 for i in buckets]  # fmt: skip
        assert views == [writable] * len(buckets)
        assert all(a.flags.writeable for a in got.arrays.values())
        loaded = state_from_image(got)
        assert all(torch.equal(loaded[name], before[name]) for name in state)


def test_an_image_leaves_out_a_tied_tensor_and_keeps_every_empty_one() -> None:
    """A tensor sharing another's memory (tied embeddings) is left out, as save_pretrained
    leaves it; empty tensors share no memory with anything, whatever their address, and the
    first tensor of a state may be one."""
    import torch

    from grpo.weights.stream.torch_bits import image_from_state, state_from_image

    embed = torch.randn(4, 3)
    state = {"empty": torch.zeros(0), "embed": embed, "head": embed, "none": torch.zeros(0, 3)}
    image = image_from_state(1, state, 1 << 20, False)
    assert [s.name for s in image.manifest.specs] == ["empty", "embed", "none"]
    got = state_from_image(image)
    assert torch.equal(got["embed"], embed) and got["none"].shape == (0, 3)


def _forged(frames: list, **fields) -> list:
    """The bucket's frames with other header fields, sealed as the encoders seal them."""
    header = dict(msgpack.unpackb(bytes(frames[0])[8:]), **fields)
    packed = msgpack.packb(header, use_bin_type=True)
    if header["base"] == FULL_COPY:  # the frame checksum covers a full copy's header alone
        return [*seal(packed), frames[1]]
    return seal(packed, [frames[1]])


def test_a_bucket_whose_parts_do_not_tile_its_payload_is_refused() -> None:
    """A delta bucket's part lengths must cover the payload exactly: no part past its end, no
    bytes left over (a source cannot smuggle bytes the tensors do not account for)."""
    frames, _ = encode_image_bucket(model(2), 0, model(1))
    header = msgpack.unpackb(bytes(frames[0])[8:])
    assert header["base"] == 1 and header["tensors"], "not a delta bucket"
    for delta in (-4, 4):
        (name, kind, lengths), *rest = header["tensors"]
        with pytest.raises(FrameError, match="its parts"):
            decode_bucket(_forged(frames, tensors=[[name, kind, [lengths[0] + delta]], *rest]),
                          64 * MB)  # fmt: skip


def test_a_full_copy_bucket_is_its_tensors_and_nothing_else() -> None:
    """A bucket of full copies lists no tensors (the manifest says what its payload holds), a
    delta bucket lists them all; a full copy's payload of another size than its tensors', or
    of other bytes, is not staged."""
    image = model(1)
    frames, _ = encode_image_bucket(image, 0, None)
    assert msgpack.unpackb(bytes(frames[0])[8:])["tensors"] == []
    entry = [image.manifest.specs[0].name, "full", [4]]
    with pytest.raises(FrameError, match="full copies lists tensors"):
        decode_bucket(_forged(frames, tensors=[entry]), 64 * MB)
    with pytest.raises(FrameError, match="lists no tensors"):
        decode_bucket(_forged(frames, base=0), 64 * MB)
    # The frame checksum covers a full copy's header (a flipped bit in it is refused on
    # decoding); its payload, the manifest's bucket checksum, checked once, where it is staged.
    changed = msgpack.packb(dict(msgpack.unpackb(bytes(frames[0])[8:]), index=1))
    with pytest.raises(FrameError, match="checksum"):
        decode_bucket([bytes(frames[0])[:8] + changed, frames[1]], 64 * MB)
    staging = Staging(image.manifest)
    with pytest.raises(ApplyError, match="holds .* bytes"):
        staging.apply(decode_bucket([frames[0], bytes(frames[1])[:-4]], 64 * MB), None)
    flipped = bytearray(frames[1])
    flipped[0] ^= 1
    with pytest.raises(ApplyError, match="checksum"):
        staging.apply(decode_bucket([frames[0], flipped], 64 * MB), None)
    assert staging.arrays == {} and staging.missing() == list(range(len(image.manifest.buckets)))


def test_a_dead_source_is_passed_over_for_the_next(ctx: zmq.Context) -> None:
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(model(1))
    dead = ctx.socket(zmq.ROUTER)  # bound, never answers: a relay hung or SIGSTOPped
    port = dead.bind_to_random_port("tcp://127.0.0.1")
    with serving(store, ctx) as addr:
        rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=0.5)
        got = rx.receive([f"tcp://127.0.0.1:{port}", addr], 1, None)
    dead.close()
    assert same(got, model(1)) and rx.stats.fallbacks["source failed"] == 1


def test_a_chain_of_relays_passes_a_version_down_bucket_by_bucket(ctx: zmq.Context) -> None:
    store = VersionStore(keep=2, budget_bytes=64 * MB)
    store.add(model(1))
    relays = [RelaySource(), RelaySource()]
    with (
        serving(store, ctx) as trainer,
        serving(relays[0], ctx) as r0,
        serving(relays[1], ctx) as r1,
    ):
        chain = [[trainer], [r0, trainer], [r1, r0, trainer]]
        got: list[Image] = []

        def receive(i: int) -> None:
            rx = VersionFetcher(ctx, None, max_bytes=64 * MB, timeout_s=5)
            relay = relays[i] if i < len(relays) else None
            image = rx.receive(
                chain[i],
                1,
                None,
                sink=relay.took if relay else None,
                staged=relay.started if relay else None,
            )
            if relay is not None:
                relay.finished(image)
            got.append(image)

        threads = [threading.Thread(target=receive, args=(i,)) for i in (2, 1, 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert len(got) == 3 and all(same(g, model(1)) for g in got)


def test_the_tree_of_relays() -> None:
    relays = {f"s{i}": f"addr{i}" for i in range(7)}
    assert upstream("s0", relays, 2) == []
    assert upstream("s6", relays, 2) == ["addr2", "addr0"]
    assert upstream("s3", relays, 1) == ["addr2", "addr1", "addr0"]
    assert upstream("gone", relays, 2) == [] and upstream("s3", relays, 0) == []


def test_a_store_keeps_the_newest_within_its_budget() -> None:
    one = sum(a.nbytes for a in model(1).arrays.values())
    store = VersionStore(keep=3, budget_bytes=2 * one)
    for v in range(1, 5):
        store.add(model(v))
    assert list(store.images) == [3, 4]
    with pytest.raises(KeyError):
        store.bucket(4, 1, 0)
    assert store.bucket(4, FULL_COPY, 0) is not None and store.bucket(9, FULL_COPY, 0) is None


def test_adapter_state_names_and_shares_what_peft_saves(tiny_model_dir) -> None:
    """The trainer publishes and the sampler loads the adapter by adapter_state's names: they
    must be peft's own (what save_pretrained writes, what a shared-dir sampler reads)."""
    import torch
    from peft import get_peft_model_state_dict

    from grpo.config import LoraConfig
    from grpo.models.loading import adapter_state, apply_lora, load_causal_lm

    model = apply_lora(load_causal_lm(tiny_model_dir), LoraConfig(enabled=True))
    ours, peft = adapter_state(model), get_peft_model_state_dict(model)
    assert list(ours) == list(peft) and all(torch.equal(ours[k], peft[k]) for k in peft)
    name = next(iter(ours))
    ours[name].add_(1.0)  # a view of the parameter itself: loading into it loads the model
    assert torch.equal(get_peft_model_state_dict(model)[name], ours[name])


def test_adapter_state_reads_what_the_parameters_hold_when_asked(tiny_model_dir) -> None:
    """The adapter's parameters are found once per model, their tensors read at each call: what
    a ZeRO-3 gather (or any swap of a parameter's data) put in them is what is published."""
    import torch

    from grpo.config import LoraConfig
    from grpo.models.loading import adapter_state, apply_lora, load_causal_lm

    model = apply_lora(load_causal_lm(tiny_model_dir), LoraConfig(enabled=True))
    name, first = next(iter(adapter_state(model).items()))
    param = next(p for n, p in model.named_parameters() if "lora_" in n)
    param.data = torch.full_like(param, 7.0)  # what GatheredParameters does for its block
    now = adapter_state(model)[name]
    assert torch.equal(now, torch.full_like(first, 7.0)) and not torch.equal(now, first)


def test_copy_state_refuses_a_mismatch_before_copying_anything() -> None:
    import torch

    from grpo.models.loading import copy_state

    targets = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(RuntimeError, match=r"other shapes \['b'\]"):
        copy_state(targets, {"a": torch.ones(2), "b": torch.ones(4)}, set(), "version 3")
    with pytest.raises(RuntimeError, match=r"missing \['b'\], unexpected \['c'\]"):
        copy_state(targets, {"a": torch.ones(2), "c": torch.ones(3)}, set(), "version 3")
    assert not targets["a"].any()  # all or nothing: not even the tensor that fitted
    copy_state(targets, {"a": torch.ones(2)}, {"b"}, "version 3")  # b may be missing: tied
    assert targets["a"].all()


def test_a_relay_encodes_a_bucket_once_per_base_however_many_children_ask(monkeypatch) -> None:
    """A relay holding versions 1 and 2 answers 150 requests for each bucket of version 2 as a
    delta from 1 with one encoding per bucket (issue 42: each request used to re-encode), and
    forgets the encodings of a version once it no longer serves it."""
    from grpo.weights.stream import relay as relay_module

    calls: list[int] = []
    real = relay_module.encode_image_bucket

    def counting(image, index, base, delta=True):
        calls.append(index)
        return real(image, index, base, delta)

    monkeypatch.setattr(relay_module, "encode_image_bucket", counting)
    relay = RelaySource()
    relay.finished(model(1))
    relay.finished(model(2))
    buckets = len(model(2).manifest.buckets)
    for _ in range(150):
        for index in range(buckets):
            assert relay.bucket(2, 1, index) is not None
    assert sorted(calls) == list(range(buckets))
    relay.finished(model(3))
    relay.finished(model(4))  # version 2 is not served any more
    assert relay._encoded == {}
