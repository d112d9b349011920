"""Mutations of the streamed weights' root of trust (issue 42, item 2): the trainer announces
each version's manifest identity, and a sampler takes a manifest from any source only when it
has that identity."""

from __future__ import annotations

from tests.mutations import Mutation

TRUST = "tests/test_weight_trust.py"

MUTATIONS = (
    Mutation(
        name="receiver_takes_any_manifest",
        item="42.2: a relay's manifest is taken only with the identity the trainer announced",
        path="grpo/delivery/stream/client.py",
        old="        if self.trusted is not None:\n            self._check_announced(manifest)\n",
        new="",
        tests=(
            f"{TRUST}::test_a_forged_version_from_a_relay_is_refused_and_the_trainer_s_taken",
            f"{TRUST}::test_a_version_the_trainer_never_announced_is_refused",
            f"{TRUST}::test_an_impostor_relay_in_a_stream_run_gets_nothing_loaded",
        ),
    ),
    Mutation(
        name="identity_without_the_tiling",
        item="42.2: the identity covers the bucket tiling",
        path="grpo/wire/weight_frames.py",
        old="                for s in self.specs], [list(b) for b in self.buckets]]",
        new="                for s in self.specs], []]",
        tests=(
            f"{TRUST}::test_identity_covers_every_field_of_the_manifest",
            f"{TRUST}::test_the_trainer_s_tensors_in_another_tiling_are_refused_and_the_trainer_"
            "still_serves",
        ),
    ),
    Mutation(
        name="trainer_names_no_versions",
        item="42.2: the trainer's heartbeats announce the identities",
        path="grpo/delivery/trainer_endpoint.py",
        old='        return {**self._status, "manifests": self.store.identities()}\n',
        new="        return self._status\n",
        tests=(
            f"{TRUST}::test_every_heartbeat_of_a_streaming_trainer_names_the_versions_it_holds",
        ),
    ),
    Mutation(
        name="identities_kept_across_a_trainer_restart",
        item="42.2: a resumed trainer's versions are not the crashed one's",
        path="grpo/delivery/sampler_endpoint.py",
        old="                status.manifests = {}  # its versions are not the old one's, whatever "
        "they number\n",
        new="",
        tests=(
            f"{TRUST}::test_the_sampler_keeps_the_announced_identities_of_the_trainer_incarnation_it_follows",
        ),
    ),
)
