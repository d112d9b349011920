"""Mutations of the trainer's delivery endpoint (issue 28's move of the protocol out of the
channel): what it reports in heartbeats, and the sampler pool it now keeps."""

from __future__ import annotations

from tests.mutations import Mutation

ENDPOINT = "grpo/delivery/trainer_endpoint.py"

MUTATIONS = (
    Mutation(
        name="endpoint_never_acknowledges",
        item="28: a saved state's batches reach the samplers as acknowledgements",
        path=ENDPOINT,
        old='''        """The ledger's consumed batches are now durable: acknowledge them."""
        self._refresh()''',
        new='''        """The ledger's consumed batches are now durable: acknowledge them."""''',
        tests=(
            "tests/test_delivery.py::test_acks_reach_the_sampler_and_a_trainer_restart_is_noticed",
        ),
    ),
    Mutation(
        name="endpoint_hears_nobody",
        item="28: the pool learns of each sampler from what it sends",
        path=ENDPOINT,
        old="""            if item is not None:
                self._heard(item)
            if isinstance(item, EpisodeBatch):
                return item""",
        new="""            if isinstance(item, EpisodeBatch):
                return item""",
        tests=(
            "tests/test_transport.py::"
            "test_a_stop_or_silence_drops_one_sampler_and_the_others_go_on",
        ),
    ),
)
