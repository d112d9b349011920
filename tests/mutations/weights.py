"""Mutations of the streamed weights (issue 42): the root of trust (item 2: the trainer announces
each version's manifest identity, and a sampler takes a manifest from any source only when it
has that identity) and every wait bounded and named (item 3)."""

from __future__ import annotations

from tests.mutations import Mutation

TRUST = "tests/test_weight_trust.py"
LIVE = "tests/test_weight_liveness.py"

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
        path="grpo/delivery/stream/server.py",
        old='    return lambda: {**status(), "manifests": store.identities()}\n',
        new="    return status\n",
        tests=(
            f"{TRUST}::test_every_heartbeat_of_a_streaming_trainer_names_the_versions_it_holds",
        ),
    ),
    Mutation(
        name="identities_kept_across_a_trainer_restart",
        item="42.2: a resumed trainer's versions are not the crashed one's",
        path="grpo/delivery/sampler_endpoint.py",
        old="                self.manifests = {}  # its versions are not the old one's, whatever "
        "they number\n",
        new="",
        tests=(
            f"{TRUST}::test_the_sampler_keeps_the_announced_identities_of_the_trainer_incarnation_it_follows",
        ),
    ),
    Mutation(
        name="held_version_of_a_crashed_trainer_taken",
        item="42.2: a held version counts only as the trainer announced it now",
        path="grpo/delivery/stream/follower.py",
        old="        return self.trusted().get(image.version) == image.manifest.identity\n",
        new="        return True\n",
        tests=(
            f"{TRUST}::test_a_version_held_from_a_crashed_trainer_is_not_taken_for_the_resumed_one_s",
        ),
    ),
    Mutation(
        name="full_copy_answered_with_a_delta_asked_again",
        item="42.3: a source that never sends what is asked fails, the next one is tried",
        path="grpo/delivery/stream/client.py",
        old="                if bucket.base not in (wanted, FULL_COPY):",
        new="                if False:",
        tests=(
            f"{LIVE}::test_a_relay_answering_full_copy_requests_with_deltas_is_left_for_the_next_"
            "source",
        ),
    ),
    Mutation(
        name="bad_address_escapes_the_fallback",
        item="42.3: connect errors fall through to the next source",
        path="grpo/delivery/stream/client.py",
        old="        except (zmq.ZMQError, OSError, ValueError) as e:",
        new="        except () as e:",
        tests=(
            f"{LIVE}::test_an_address_that_is_not_one_and_missing_keys_fall_through_to_the_trainer",
        ),
    ),
    Mutation(
        name="streamed_version_awaited_idle",
        item="42.3: a streamed transfer that stops is a stall with its name",
        path="grpo/sampler/weights.py",
        old='f"version {version}", own_phase=True)',
        new='f"version {version}")',
        tests=(
            f"{LIVE}::test_a_streamed_version_is_awaited_in_the_receiving_phase_not_the_idle_one",
        ),
    ),
    Mutation(
        name="store_keeps_only_keep_bases",
        item="42.4: the trainer keeps every version a restarted sampler may ask for",
        path="grpo/trainer/publishing.py",
        old="w.delta, protected=versions_samplers_may_ask(cfg))",
        new="w.delta)",
        tests=(f"{LIVE}::test_the_trainer_keeps_every_version_a_restarted_sampler_may_ask_for",),
    ),
)
