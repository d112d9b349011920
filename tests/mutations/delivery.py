"""Mutations of the delivery endpoints (issue 28's move of the protocol out of the channels):
what the trainer's reports in heartbeats and the sampler pool it keeps; the sampler's spool,
kept in step with the acknowledgements and resent to a restarted trainer."""

from __future__ import annotations

from tests.mutations import Mutation

ENDPOINT = "grpo/delivery/trainer_endpoint.py"
SAMPLER_ENDPOINT = "grpo/delivery/sampler_endpoint.py"
SPOOL_TEST = (
    "tests/test_delivery.py::test_the_spool_follows_the_acks_and_is_resent_to_a_restarted_trainer"
)

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
    Mutation(
        name="sampler_endpoint_keeps_acknowledged_batches",
        item="28: the sampler's spool drops what the trainer saved",
        path=SAMPLER_ENDPOINT,
        old="        self.spool.acknowledge(status.acked)\n",
        new="",
        tests=(SPOOL_TEST,),
    ),
    Mutation(
        name="sampler_endpoint_ignores_a_trainer_restart",
        item="28: a restarted trainer is sent the spool again",
        path=SAMPLER_ENDPOINT,
        old="""            self._restarts_handled = status.restarts
            self._resend(self.spool.pending())
""",
        new="""            self._restarts_handled = status.restarts
""",
        tests=(SPOOL_TEST,),
    ),
)
