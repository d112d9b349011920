"""Mutations of the wire codec and the weight stream (issue 33, items 1, 7 and 10).

Each drops one check of grpo/wire/codec.py, or the weight stream's "intact: no transfer", and
names the test that must then go red.
"""

from __future__ import annotations

from tests.mutations import Mutation

CODEC = "grpo/wire/codec.py"
EPISODE_TESTS = "tests/test_episode.py"

MUTATIONS = (
    Mutation(
        name="wire_frame_0_length_unchecked",
        item="1: random frames reach the framing checks",
        path=CODEC,
        old='    require(views[0].nbytes > _SUM.size, "frame 0 is too short for a checksum")\n',
        new="",
        tests=(f"{EPISODE_TESTS}::test_fuzz_random_frames",),
    ),
    Mutation(
        name="wire_magic_unchecked",
        item="1: bit-flipped headers are re-sealed and reach the checks",
        path=CODEC,
        old='    require(header.get("magic") == MAGIC, "bad magic")\n',
        new="",
        tests=(f"{EPISODE_TESTS}::test_fuzz_bit_flipped_headers",),
    ),
    Mutation(
        name="wire_int_lists_take_any_type",
        item="1: mutated fields are re-sealed and reach the checks",
        path=CODEC,
        old='    require(set(map(type, v)) <= {int}, f"{key} holds a non-int")\n',
        new="",
        tests=(f"{EPISODE_TESTS}::test_fuzz_mutated_fields_and_truncated_buffers",),
    ),
    Mutation(
        name="wire_array_size_unchecked",
        item="1: truncated buffers are re-sealed and reach the size check",
        path=CODEC,
        old="""        require(
            buf.nbytes == count * dtype.itemsize,
            f"array {name}: {buf.nbytes} bytes for {count} x {dtype_name}",
        )
""",
        new="",
        tests=(f"{EPISODE_TESTS}::test_fuzz_mutated_fields_and_truncated_buffers",),
    ),
    Mutation(
        name="wire_batch_frame_count_unchecked",
        item="10: extra and missing batch frames meet the frame-count check",
        path=CODEC,
        old='    require(len(frames) == 1 + len(specs), f"got {len(frames)} frames, expected '
        '{1 + len(specs)}")\n',
        new="",
        tests=(f"{EPISODE_TESTS}::test_rejects_extra_and_missing_frames",),
    ),
    Mutation(
        name="wire_message_frame_count_unchecked",
        item="10: an extra message frame meets the frame-count check",
        path=CODEC,
        old='    require(len(frames) == 1, f"message has {len(frames)} frames, expected 1")\n',
        new="",
        tests=(f"{EPISODE_TESTS}::test_rejects_extra_and_missing_frames",),
    ),
    Mutation(
        name="wire_intact_version_fetched_again",
        item="7: an intact version is not transferred again",
        path="grpo/weights/files.py",
        old="            verify_version(final)\n            return final, 0\n",
        new="            verify_version(final)  # and fetch it all the same\n",
        tests=("tests/test_weight_stream.py::test_a_version_arrives_in_chunks_and_checks_out",),
    ),
)
