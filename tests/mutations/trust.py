"""Mutations of the trainer's defences against a single bad message (issue 62, findings 4 and
5): each puts back what let one message end the run, and names the CI-tier test that must then
fail."""

from __future__ import annotations

from tests.mutations import Mutation

MUTATIONS = (
    Mutation(
        name="stop_of_an_unknown_id_dropped",
        item="62.4: a stop with a malformed sampler_id is a KeyError again",
        path="grpo/delivery/pool.py",
        old="        if sid in self.members:\n",
        new="        if True:\n",
        tests=("tests/test_pool.py::test_a_stop_in_a_name_no_sampler_has_is_ignored_not_a_crash",),
    ),
    Mutation(
        name="stop_reason_logged_whole",
        item="62.5: a peer's stop reason is logged whole (a 4 MiB line)",
        path="grpo/delivery/pool.py",
        old='f"sampler {sid} stopped: {reason[:STOP_REASON_CHARS]}"',
        new='f"sampler {sid} stopped: {reason}"',
        tests=("tests/test_pool.py::test_a_stop_in_a_name_no_sampler_has_is_ignored_not_a_crash",),
    ),
    Mutation(
        name="missing_batches_listed",
        item="62.5: a huge seq builds the list of every batch before it for a log line",
        path="grpo/delivery/ordering.py",
        old="gap = (self.next_seq(sid), first - 1)",
        new="gap = (self.next_seq(sid), len(list(range(self.next_seq(sid), first))))",
        tests=("tests/test_delivery.py::test_a_batch_that_never_comes_does_not_stop_the_run",),
    ),
)
