"""Mutations of issue 29's checks: a hostile or broken peer meets each of them."""

from __future__ import annotations

from tests.mutations import Mutation

MUTATIONS = (
    Mutation(
        name="negative_token_ids_pass",
        item="29.1: token ids below 0 are refused at the edge",
        path="grpo/core/tokens.py",
        old='"prompt_ids", "int32", PROMPT, False, "iu", "the sampler\'s tokenizer", low=0)',
        new='"prompt_ids", "int32", PROMPT, False, "iu", "the sampler\'s tokenizer")',
        tests=("tests/test_edge_validation.py::test_a_negative_token_id_is_refused",),
    ),
    Mutation(
        name="refused_batch_joins_the_pool",
        item="29.1: a refused batch leaves no trace in the pool",
        path="grpo/delivery/trainer_endpoint.py",
        old="        self.rejected_batches += 1\n",
        new="        self.pool.heard(batch.sampler_id)\n        self.rejected_batches += 1\n",
        tests=(
            "tests/test_edge_validation.py::"
            "test_a_refused_batch_leaves_no_trace_and_the_real_one_is_taken",
        ),
    ),
    Mutation(
        name="weight_request_file_type_unchecked",
        item="29.2: a weights request with a file of the wrong type is answered",
        path="grpo/weights/files.py",
        old="if type(name) is not str or name not in files",
        new="if name not in files",
        tests=("tests/test_fuzz.py::test_weight_server_replies_to_any_request",),
    ),
    Mutation(
        name="version_published_before_it_is_on_disk",
        item="29.5: a version's files are fsynced before LATEST names it",
        path="grpo/weights/dirs.py",
        old="    fsync_tree(tmp)\n",
        new="",
        tests=("tests/test_delivery.py::test_a_version_is_on_the_disk_before_latest_names_it",),
    ),
)
