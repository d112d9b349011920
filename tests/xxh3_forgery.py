"""A forger's XXH3-64 collision, in closed form: any change to a long input, hidden by two
solved stripes in each 1 KiB block (issue 62, finding 1). The tests use it to show that what a
sampler trusts no longer rests on XXH3.

XXH3-64 reads an input of over 240 bytes in blocks of 16 stripes of 64 bytes; within a block each
stripe only adds to eight 64-bit accumulators (lane i: the stripe's word i^1, plus the product of
the two 32-bit halves of word i XOR the secret), and only the block's end scrambles them. So a
block whose first 14 stripes are changed at will gets the same accumulators, and every byte
after it the same hash, once its last two stripes are solved to add what the change took away:
per lane pair, one word of each stripe is chosen with a zero product (a half of word XOR secret
zero), which leaves the additions linear.
"""

from __future__ import annotations

import numpy as np

# XXH3's default secret (kSecret, 192 bytes), as every build of xxHash holds it.
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07d"
    "ccff7221b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e"
    "3819ef46a9deacd8a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac83"
    "34d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce"
    "45cb3a8f95160428afd7fbcabb4b407e"
)
BLOCK, STRIPE, M64, M32 = 1024, 64, (1 << 64) - 1, (1 << 32) - 1


def _key(stripe: int, lane: int) -> int:
    at = 8 * stripe + 8 * lane
    return int.from_bytes(SECRET[at : at + 8], "little")


def _product(word: int, key: int) -> int:
    k = word ^ key
    return (k & M32) * (k >> 32)


def _adds(words: list[list[int]]) -> list[int]:
    """What the stripes (8 words each) add to the eight accumulators, mod 2^64."""
    out = [0] * 8
    for j, w in enumerate(words):
        for i in range(8):
            out[i] = (out[i] + w[i ^ 1] + _product(w[i], _key(j, i))) & M64
    return out


def _solve(target: list[int]) -> tuple[list[int], list[int]]:
    """Stripes 14 and 15 adding `target` to the accumulators."""
    s14, s15 = [0] * 8, [0] * 8
    for a in range(0, 8, 2):
        b = a + 1
        k14a, k15a, k14b, k15b = _key(14, a), _key(15, a), _key(14, b), _key(15, b)
        # lane a: any word in stripe 14, and stripe 15's fills acc[b] (lane b's products are 0)
        s14[a], s15[a] = 0, (target[b] - 0) & M64
        rest = (target[a] - _product(s14[a], k14a) - _product(s15[a], k15a)) & M64
        # lane b: stripe 14's word has the key's high half (product 0, low half free), stripe
        # 15's the key's low half (product 0, high half free); together they add `rest`
        low = (rest - (k15b & M32)) & M32
        carry = (low + (k15b & M32)) >> 32
        high = ((rest >> 32) - (k14b >> 32) - carry) & M32
        s14[b], s15[b] = (k14b & ~M32 & M64) | low, (high << 32) | (k15b & M32)
    return s14, s15


def forge(original: bytes, wanted: bytes) -> bytes:
    """`wanted`'s bytes in the first 14 stripes of every full block but the input's last, the
    rest solved: a different input with `original`'s XXH3-64 (both of one length, over
    1 KiB). The last block, whole or not, is `original`'s: XXH3 reads it again for its tail."""
    if len(original) != len(wanted) or len(original) <= BLOCK:
        raise ValueError("forge needs two inputs of one length, over 1 KiB")
    out = bytearray(original)
    for start in range(0, (len(original) - 1) // BLOCK * BLOCK, BLOCK):
        words = np.frombuffer(original, "<u8", BLOCK // 8, start).reshape(16, 8).tolist()
        new = np.frombuffer(wanted, "<u8", 14 * 8, start).reshape(14, 8).tolist()
        need = [(o - n) & M64 for o, n in zip(_adds(words), _adds(new), strict=True)]
        s14, s15 = _solve(need)
        block = np.array([*new, s14, s15], dtype="<u8")
        out[start : start + BLOCK] = block.tobytes()
    return bytes(out)


def forged_image(real):
    """`real` (a grpo.weights.stream.image.Image) under its own manifest, every bucket's bytes
    forged to the same XXH3-64 with most of its values 1e4 (float32's bit pattern): what a relay
    or a group impostor would serve. Checked here: XXH3-equal, and mostly other bytes."""
    from grpo.core.checksum import checksum
    from grpo.weights.stream.image import Image

    flats = {}
    for index in range(len(real.manifest.buckets)):
        original = real.bucket_bytes(index).tobytes()
        wanted = np.full(len(original) // 4, 1e4, np.float32).tobytes()
        forged = forge(original, wanted)
        assert checksum([forged]) == checksum([original]) and forged != original
        changed = np.frombuffer(forged, np.uint8) != np.frombuffer(original, np.uint8)
        assert changed.mean() > 0.5, changed.mean()
        flats[index] = np.frombuffer(forged, np.uint8).copy()
    return Image(real.manifest, flats=flats)
