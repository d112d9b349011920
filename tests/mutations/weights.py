"""Mutations of the weights path (issue 42): the root of trust (item 2: the trainer announces
each version's manifest identity, and a sampler takes a manifest from any source only when it
has that identity), every wait bounded and named (item 3), and the collective mode (item 5)."""

from __future__ import annotations

from tests.mutations import Mutation

TRUST = "tests/test_weight_trust.py"
LIVE = "tests/test_weight_liveness.py"
GROUP = "tests/test_weight_collective.py"
CHAOS = "tests/test_chaos.py"
MODES = "tests/test_weight_modes.py"
RECEIVER = "tests/test_weight_receiver.py"
LOADING = "tests/test_weight_loading.py"
FLAT = (
    "tests/test_weight_streaming.py::test_a_full_copy_bucket_is_its_tensors_back_to_back_in_a_"
    "buffer_of_its_own"
)

MUTATIONS = (
    Mutation(
        name="receiver_takes_any_manifest",
        item="42.2: a relay's manifest is taken only with the identity the trainer announced",
        path="grpo/weights/stream/client.py",
        old="        if self.trusted is not None:\n"
        "            check_announced(manifest, self.trusted, self.timeout_s)\n",
        new="",
        tests=(
            f"{TRUST}::test_a_forged_version_from_a_relay_is_refused_and_the_trainer_s_taken",
            f"{TRUST}::test_a_version_the_trainer_never_announced_is_refused",
            f"{TRUST}::test_a_hostile_relay_in_a_stream_run_gets_nothing_loaded_and_the_run_ends",
        ),
    ),
    Mutation(
        name="identity_without_the_tiling",
        item="42.2: the identity covers the bucket tiling and the buckets' checksums",
        path="grpo/weights/stream/frames.py",
        old="        body = [self.version, self.adapter, self.spec_list, self._bucket_list()]",
        new="        body = [self.version, self.adapter, self.spec_list, []]",
        tests=(
            f"{TRUST}::test_identity_covers_every_field_of_the_manifest",
            f"{TRUST}::test_the_trainer_s_tensors_in_another_tiling_are_refused_and_the_trainer_"
            "still_serves",
        ),
    ),
    Mutation(
        name="trainer_names_no_versions",
        item="42.2: the trainer's heartbeats announce the identities",
        path="grpo/weights/modes/stream.py",
        old='        return {"manifests": self.store.identities(), "relays": relays}\n',
        new='        return {"relays": relays}\n',
        tests=(
            f"{TRUST}::test_every_heartbeat_of_a_streaming_trainer_names_the_versions_it_holds",
        ),
    ),
    Mutation(
        name="identities_kept_across_a_trainer_restart",
        item="42.2: a resumed trainer's versions are not the crashed one's",
        path="grpo/weights/modes/stream.py",
        old="        if restarted:  # its versions are not the old one's, whatever they number\n",
        new="        if False:\n",
        tests=(
            f"{TRUST}::test_the_sampler_keeps_the_announced_identities_of_the_trainer_incarnation_it_follows",
        ),
    ),
    Mutation(
        name="held_version_of_a_crashed_trainer_taken",
        item="42.2: a held version counts only as the trainer announced it now",
        path="grpo/weights/stream/follower.py",
        old="        return self.trusted().get(image.version) == image.manifest.identity\n",
        new="        return True\n",
        tests=(
            f"{TRUST}::test_a_version_held_from_a_crashed_trainer_is_not_taken_for_the_resumed_one_s",
        ),
    ),
    Mutation(
        name="full_copy_answered_with_a_delta_asked_again",
        item="42.3: a source that never sends what is asked fails, the next one is tried",
        path="grpo/weights/stream/client.py",
        old="            if bucket.base not in (wanted, FULL_COPY):",
        new="            if False:",
        tests=(
            f"{LIVE}::test_a_relay_answering_full_copy_requests_with_deltas_is_left_for_the_next_"
            "source",
        ),
    ),
    Mutation(
        name="bad_address_escapes_the_fallback",
        item="42.3: connect errors fall through to the next source",
        path="grpo/weights/stream/connections.py",
        old="        except (zmq.ZMQError, OSError, ValueError) as e:",
        new="        except () as e:",
        tests=(
            f"{LIVE}::test_an_address_that_is_not_one_and_missing_keys_fall_through_to_the_trainer",
        ),
    ),
    Mutation(
        name="streamed_version_awaited_idle",
        item="42.3: a streamed transfer that stops is a stall with its name",
        path="grpo/delivery/sampler_endpoint.py",
        old="        self.endpoint.wait_until(ready, what, own_phase=True)",
        new="        self.endpoint.wait_until(ready, what)",
        tests=(
            f"{LIVE}::test_a_streamed_version_is_awaited_in_the_receiving_phase_not_the_idle_one",
        ),
    ),
    Mutation(
        name="store_keeps_only_keep_bases",
        item="42.4: the trainer keeps every version a restarted sampler may ask for",
        path="grpo/weights/publisher.py",
        old="w.delta, protected=versions_samplers_may_ask(cfg))",
        new="w.delta)",
        tests=(f"{LIVE}::test_the_trainer_keeps_every_version_a_restarted_sampler_may_ask_for",),
    ),
    Mutation(
        name="group_member_skips_the_checksums",
        item="42.5: a broadcast version is taken only when every bucket matches its manifest",
        path="grpo/weights/collective/member.py",
        old="        wrong = [i for i, s in enumerate(sums) if s.result() != manifest.sums[i]]",
        new="        wrong = []",
        tests=(f"{GROUP}::test_a_version_failing_its_checksums_is_lost_but_the_group_goes_on",),
    ),
    Mutation(
        name="broadcaster_dies_of_its_own_error",
        item="63.9: an exception of the broadcaster's own ends its thread, versions go by stream",
        path="grpo/weights/collective/broadcaster.py",
        old="            except Exception as e:  # a fault of ours",
        new="            except ZeroDivisionError as e:  # a fault of ours",
        tests=(
            f"{GROUP}::test_a_fault_of_the_broadcaster_s_own_is_named_and_the_group_comes_back",
        ),
    ),
    Mutation(
        name="group_operations_unbounded",
        item="42.5: a stalled member is dropped within weights.collective_timeout_s",
        path="grpo/weights/collective/group.py",
        old="    opts._timeout = datetime.timedelta(seconds=timeout_s)",
        new="    opts._timeout = datetime.timedelta(seconds=1800)",
        tests=(
            f"{GROUP}::test_a_stalled_member_is_dropped_in_time_and_rejoins_when_it_moves_again",
        ),
    ),
    Mutation(
        name="failed_member_invited_again_at_once",
        item="42.5: the group re-forms without a dead or stalled member",
        path="grpo/weights/collective/membership.py",
        old="            return left >= failed_in[(sid, incarnation)]\n",
        new="            return True\n",
        tests=(
            f"{GROUP}::test_who_the_next_group_holds",
            f"{GROUP}::test_a_stalled_member_is_dropped_in_time_and_rejoins_when_it_moves_again",
        ),
    ),
    Mutation(
        name="restarted_sampler_counted_as_its_predecessor",
        item="42.5: a restarted sampler rejoins the group",
        path="grpo/weights/collective/membership.py",
        old="        return failed_incarnations[sid] < MAX_FAILED_INCARNATIONS\n",
        new="        return left >= max((g for (s, _), g in failed_in.items() if s == sid), "
        "default=0)\n",
        tests=(
            f"{GROUP}::test_who_the_next_group_holds",
            f"{CHAOS}::test_a_sigkilled_trainer_then_sampler_resume_and_train_every_batch_"
            "exactly_once[collective]",
        ),
    ),
    Mutation(
        name="collective_sampler_never_loads_a_broadcast",
        item="42.5: a collective run's versions come by broadcast, not by stream",
        path="grpo/weights/modes/collective.py",
        old="lambda: self.group, self.follower.offer)",
        new="lambda: self.group, lambda image: None)",
        tests=(
            f"{CHAOS}::test_a_sigkilled_trainer_then_sampler_resume_and_train_every_batch_"
            "exactly_once[collective]",
        ),
    ),
    Mutation(
        name="version_the_group_brings_also_streamed",
        item="42.5: a version the group will bring is not also streamed",
        path="grpo/weights/stream/follower.py",
        old="                brought = self._current(sent) or self.expected(target)",
        new="                brought = self._current(sent)",
        tests=(f"{GROUP}::test_a_version_the_group_will_bring_is_not_also_streamed",),
    ),
    Mutation(
        name="broadcast_taken_on_the_group_s_word",
        item="42.2/42.5: a broadcast version is taken only under the announced identity",
        path="grpo/weights/stream/follower.py",
        old="            if self._current(sent := self.broadcast.get(version)):",
        new="            if (sent := self.broadcast.get(version)) is not None:",
        tests=(
            f"{GROUP}::test_a_broadcast_version_is_taken_only_under_the_identity_the_trainer_"
            "announced",
        ),
    ),
    Mutation(
        name="unannounced_broadcast_awaited_for_ever",
        item="42.3/42.5: a broadcast version that cannot be taken is streamed, not awaited",
        path="grpo/weights/stream/follower.py",
        old="                brought = self._current(sent) or self.expected(target)",
        new="                brought = sent is not None or self.expected(target)",
        tests=(f"{GROUP}::test_a_broadcast_the_trainer_never_announced_is_streamed_instead",),
    ),
    Mutation(
        name="member_expects_a_version_already_sent",
        item="42.3/42.5: a version the group sent and the sampler could not take is streamed",
        path="grpo/weights/collective/member.py",
        old="        return first is not None and version >= first and version > self._last",
        new="        return first is not None and version >= first",
        tests=(f"{GROUP}::test_a_version_failing_its_checksums_is_lost_but_the_group_goes_on",),
    ),
    Mutation(
        name="bucket_socket_takes_any_frame",
        item="42 bounds: the receiving socket takes no frame larger than the version's",
        path="grpo/weights/stream/client.py",
        old="                sock = attempt.socket(largest_frame(manifest))",
        new="                sock = attempt.socket(self.max_bytes)",
        tests=(
            f"{LIVE}::test_a_frame_larger_than_the_version_allows_is_refused_before_it_is_held",
        ),
    ),
    Mutation(
        name="relay_encodes_every_request",
        item="42 bounds: a relay encodes a bucket once per base, not once per request",
        path="grpo/weights/stream/relay.py",
        old="            if (frames := self._encoded.get(key)) is not None:\n"
        "                return frames",
        new="            pass",
        tests=(
            "tests/test_weight_streaming.py::test_a_relay_encodes_a_bucket_once_per_base_however_"
            "many_children_ask",
        ),
    ),
    Mutation(
        name="resumed_trainer_forgets_the_versions_before_its_state",
        item="42.4: a sampler restarted at max_staleness 2 resumes with streamed versions",
        path="grpo/trainer/loop.py",
        old="            self.publisher.restore(resumed.where)",
        new="            pass",
        tests=(
            "tests/test_continuous_runs.py::test_every_process_sigkilled_with_answers_in_flight_"
            "resumes_to_the_same_weights[stream]",
        ),
    ),
    Mutation(
        name="vllm_takes_half_a_version",
        item="42.1: a streamed version goes into vLLM whole or not at all",
        path="grpo/rollout/vllm.py",
        old='        require_same_tensors(self.checkpoint, state, {"lm_head.weight"}, '
        'f"version {version}")\n',
        new="",
        tests=(
            "tests/test_vllm.py::test_half_a_streamed_version_is_refused_before_it_reaches_the_"
            "engine",
        ),
    ),
    Mutation(
        name="version_lost_to_a_restart_is_fatal",
        item="42.4: a version the restarted trainer has not republished yet is waited for",
        path="grpo/weights/in_use.py",
        old="            return status.restarts != restarts or status.version < target\n",
        new="            return status.restarts != restarts\n",
        tests=(
            "tests/test_weight_stream.py::test_a_version_lost_to_a_trainer_restart_is_waited_"
            "for_again",
        ),
    ),
    Mutation(
        name="files_receiver_never_fetches",
        item="42.1: each mode's receiver hands over what the trainer published (files: fetched)",
        path="grpo/weights/modes/files.py",
        old="            self.fetcher.fetch(self.run_dir, number, self.keep)\n",
        new="            pass\n",
        tests=(f"{MODES}::test_each_mode_hands_the_sampler_the_version_the_trainer_published",),
    ),
    Mutation(
        name="dir_receiver_skips_the_checksums",
        item="42.1: a version dir is handed over only when every file checks out",
        path="grpo/weights/modes/shared_dir.py",
        old="            verify_version(vdir)\n",
        new="            pass\n",
        tests=("tests/test_delivery.py::test_sampler_keeps_its_weights_when_a_version_is_corrupt",),
    ),
    Mutation(
        name="weights_server_failure_unreported",
        item="42.1: the weights server, apart from the episode channel, still stops the run",
        path="grpo/weights/serving.py",
        old="args=(router, self._closing, failed)",
        new="args=(router, self._closing, lambda why: None)",
        tests=(
            "tests/test_weight_stream.py::test_a_weights_server_that_dies_stops_the_run_with_its_"
            "cause",
        ),
    ),
    Mutation(
        name="vllm_reads_tensors_of_a_version_dir",
        item="42.1: one load call; vLLM reads a version dir's files itself",
        path="grpo/rollout/vllm.py",
        old="        if version.vdir is None:\n",
        new="        if True:\n",
        tests=("tests/test_vllm.py::test_in_place_reload_serves_the_new_weights",),
    ),
    Mutation(
        name="sampler_records_the_version_it_asked_for",
        item="42.1: the sampler holds the version its receiver handed over",
        path="grpo/weights/in_use.py",
        old="        self.version = version.number\n",
        new="        self.version = number\n",
        tests=(f"{MODES}::test_the_sampler_holds_the_version_its_receiver_handed_over",),
    ),
    Mutation(
        name="image_shares_the_model_s_memory",
        item="42.7: a version image's bucket buffer is a copy (the trainer steps on meanwhile)",
        path="grpo/weights/stream/torch_bits.py",
        old='    return raw.to("cpu", copy=True).numpy()',
        new='    return raw.to("cpu").numpy()',
        tests=(f"{FLAT}[one each]",),
    ),
    Mutation(
        name="staging_copies_the_socket_s_buffer",
        item="42.7: a received bucket's tensors are views of the socket's buffer, not a copy",
        path="grpo/weights/stream/image.py",
        old="            self.flats[index] = whole if whole.flags.writeable else whole.copy()\n",
        new="            self.flats[index] = whole.copy()\n",
        tests=(f"{FLAT}[one bucket]",),
    ),
    Mutation(
        name="staging_keeps_a_read_only_payload",
        item="42.7: a read-only payload (a relay's bytes) is copied: a staged tensor is writable",
        path="grpo/weights/stream/image.py",
        old="            self.flats[index] = whole if whole.flags.writeable else whole.copy()\n",
        new="            self.flats[index] = whole\n",
        tests=(f"{FLAT}[one each]",),
    ),
    Mutation(
        name="bucket_parts_need_not_tile_the_payload",
        item="42.7: a bucket's part lengths cover its one payload frame exactly",
        path="grpo/weights/stream/frames.py",
        old="    require(at == payload.nbytes, f\"a bucket's payload of {payload.nbytes} bytes, "
        'its parts {at}")\n',
        new="",
        tests=(
            "tests/test_weight_streaming.py::test_a_bucket_whose_parts_do_not_tile_its_payload_is_"
            "refused",
        ),
    ),
    Mutation(
        name="receiver_reconnects_every_version",
        item="42.7: a receiver keeps the connections of a version received whole",
        path="grpo/weights/stream/connections.py",
        old="        if self.connections.reuse:\n",
        new="        if False:\n",
        tests=(f"{RECEIVER}::test_a_receiver_keeps_its_connections_from_one_version_to_the_next",),
    ),
    Mutation(
        name="receiver_keeps_a_failed_source_s_sockets",
        item="42.3/42.7: the sockets of a failed source (answers may still come) are not kept",
        path="grpo/weights/stream/client.py",
        old="            except SourceFailed as e:\n                attempt.failed()\n",
        new="            except SourceFailed as e:\n"
        "                attempt.connections.kept.update(attempt.used)\n",
        tests=(f"{RECEIVER}::test_a_source_that_failed_is_connected_to_afresh",),
    ),
    Mutation(
        name="receiver_asks_no_buckets_ahead",
        item="42.7: the first buckets are asked for with the manifest",
        path="grpo/weights/stream/client.py",
        old="                if held is not None and staging is None and not newer:\n",
        new="                if False:\n",
        tests=(f"{RECEIVER}::test_the_first_buckets_are_asked_for_with_the_manifest",),
    ),
    Mutation(
        name="buckets_asked_ahead_read_in_any_tiling",
        item="42.3/42.7: buckets asked ahead are read only when the manifest tiles them so",
        path="grpo/weights/stream/client.py",
        old="                if asked and not manifest.cut_like(held.manifest):",
        new="                if False:",
        tests=(f"{RECEIVER}::test_buckets_asked_ahead_in_another_tiling_are_not_read",),
    ),
    Mutation(
        name="manifest_takes_the_held_specs_whatever_it_lists",
        item="42.7: a held version's specs are reused only for a manifest listing the same",
        path="grpo/weights/stream/frames.py",
        old="        if known is not None and raw == known.spec_list:",
        new="        if known is not None:",
        tests=(
            f"{RECEIVER}::test_a_manifest_of_other_tensors_than_the_held_version_s_is_read_as_its_"
            "own",
        ),
    ),
    Mutation(
        name="full_copy_bucket_checksum_unchecked",
        item="42.2/42.7: a bucket of full copies is staged only when it matches its checksum",
        path="grpo/weights/stream/image.py",
        old="            if bucket_sum([whole]) != m.sums[index]:",
        new="            if False:",
        tests=(
            "tests/test_weight_streaming.py::test_a_full_copy_bucket_is_its_tensors_and_nothing_"
            "else",
        ),
    ),
    Mutation(
        name="delta_bucket_checksum_unchecked",
        item="42.7: a delta bucket's result is staged only when it matches the bucket's checksum",
        path="grpo/weights/stream/image.py",
        old="        if bucket_sum(list(decoded.values())) != m.sums[index]:",
        new="        if False:",
        tests=(
            "tests/test_weight_streaming.py::test_a_wrong_base_fails_its_checksum_and_is_fetched_"
            "whole",
        ),
    ),
    Mutation(
        name="adapter_state_keeps_the_tensors_it_found",
        item="42.7: the adapter's parameters are found once, their tensors read at each call",
        path="grpo/models/loading.py",
        old='            (name.replace(prefix, "."), p)\n',
        new='            (name.replace(prefix, "."), p.detach())\n',
        tests=(
            "tests/test_weight_streaming.py::test_adapter_state_reads_what_the_parameters_hold_"
            "when_asked",
        ),
    ),
    Mutation(
        name="unreadable_kept_version_names_no_way_on",
        item="42.4: a kept version that does not read back stops the resume saying how to go on",
        path="grpo/weights/publisher.py",
        old="        except ValueError as e:\n",
        new="        except KeyError as e:\n",
        tests=(
            f"{LIVE}::test_a_kept_version_that_does_not_read_back_stops_the_resume_saying_how_"
            "to_go_on",
        ),
    ),
    Mutation(
        name="image_key_only_for_non_empty_tensors",
        item="42.7: a state whose first tensor is empty still makes a version image",
        path="grpo/weights/stream/torch_bits.py",
        old="        key = (t.data_ptr(), shape)\n        if key in seen and t.numel():\n",
        new="        if t.numel() and (key := (t.data_ptr(), shape)) in seen:\n",
        tests=(
            "tests/test_weight_streaming.py::test_an_image_leaves_out_a_tied_tensor_and_keeps_"
            "every_empty_one",
        ),
    ),
    Mutation(
        name="full_copy_header_unchecked",
        item="42.7: a full copy's frame checksum still covers its header",
        path="grpo/weights/stream/frames.py",
        old='    require(checksum(covered) == expected, "a bucket\'s checksum does not match")',
        new="    require(base == FULL_COPY or checksum(covered) == expected, 'unchecked')",
        tests=(
            "tests/test_weight_streaming.py::test_a_full_copy_bucket_is_its_tensors_and_nothing_"
            "else",
        ),
    ),
    Mutation(
        name="corrupt_full_copy_fails_its_source_at_once",
        item="42.3/42.7: a full copy failing its checksum is asked again before its source fails",
        path="grpo/weights/stream/client.py",
        old="        if bucket is not None and bucket.base != FULL_COPY:",
        new="        if bucket is not None and bucket.base == FULL_COPY:\n"
        '            raise SourceFailed(f"a full copy: {e}") from None\n'
        "        if bucket is not None:",
        tests=(
            f"{RECEIVER}::test_a_full_copy_that_fails_its_checksum_is_asked_again_then_its_source_"
            "passed_over",
        ),
    ),
    Mutation(
        name="load_plan_checks_nothing",
        item="42.1/42.7: a version in memory goes into the policy whole or not at all",
        path="grpo/weights/stream/torch_bits.py",
        old="        require_same_shapes({n: tuple(t.shape) for n, t in targets.items()}, given, "
        "tied, what)\n",
        new="",
        tests=(f"{LOADING}::test_a_version_of_another_model_is_refused_before_anything_is_copied",),
    ),
    Mutation(
        name="adapter_left_scattered",
        item="42.7: the sampler holds its adapter in one buffer, loaded with one copy a bucket",
        path="grpo/models/loading.py",
        old="    if not params or len({(p.dtype, p.device) for p in params}) != 1:",
        new="    if True:",
        tests=(
            f"{LOADING}::test_a_streamed_adapter_goes_into_the_sampler_s_packed_policy_one_copy_"
            "a_bucket",
            f"{LOADING}::test_pack_adapter_keeps_the_model_as_it_was",
        ),
    ),
    Mutation(
        name="bucket_copied_past_the_policy",
        item="42.7: one copy a bucket writes the policy's own tensors",
        path="grpo/weights/stream/torch_bits.py",
        old="    return first.as_strided((sum(t.numel() for t in targets),), (1,))",
        new="    return first.as_strided((sum(t.numel() for t in targets),), (1,)).clone()",
        tests=(
            f"{LOADING}::test_a_streamed_adapter_goes_into_the_sampler_s_packed_policy_one_copy_"
            "a_bucket",
        ),
    ),
    Mutation(
        name="forgotten_failure_tried_again_at_once",
        item="42.4: a sampler whose version a restarted trainer lost waits for it to be out again",
        path="grpo/weights/stream/follower.py",
        old="            if self._target == version:",
        new="            if False:",
        tests=(
            f"{LIVE}::test_a_forgotten_failure_is_not_tried_again_before_the_version_is_wanted",
        ),
    ),
    Mutation(
        name="pool_hands_out_a_buffer_still_held",
        item="42.7: a version's host memory is reused only once nothing holds it",
        path="grpo/weights/stream/buffers.py",
        old="_HELD_BY_THE_POOL_ALONE = 2\n",
        new="_HELD_BY_THE_POOL_ALONE = 99\n",
        tests=(
            "tests/test_weight_buffers.py::test_a_buffer_is_handed_out_again_only_once_nothing_"
            "holds_it",
            "tests/test_weight_buffers.py::test_a_version_built_from_the_pool_never_writes_a_"
            "version_still_held",
        ),
    ),
    Mutation(
        name="trainer_image_joins_every_bucket",
        item="42.7: the trainer's flat parameter group is copied with one call a bucket",
        path="grpo/weights/stream/torch_bits.py",
        old="    tensors = [span] if span is not None else tensors\n",
        new="",
        tests=(f"{LOADING}::test_a_flat_parameter_group_is_copied_whole_never_across_padding",),
    ),
    Mutation(
        name="manifest_sent_with_every_version",
        item="42.7: a version cut like the one before is broadcast without its manifest",
        path="grpo/weights/collective/broadcaster.py",
        old="        if sent is not None and _same_layout(manifest, sent):",
        new="        if False:",
        tests=(f"{GROUP}::test_a_version_cut_like_the_one_before_is_sent_without_its_manifest",),
    ),
    Mutation(
        name="header_checksums_ignored",
        item="42.5: a version sent without its manifest is checked against its own checksums",
        path="grpo/weights/collective/member.py",
        old="            manifest = dataclasses.replace(previous, version=version, sums=sums)",
        new="            manifest = dataclasses.replace(previous, version=version)",
        tests=(f"{GROUP}::test_a_version_cut_like_the_one_before_is_sent_without_its_manifest",),
    ),
    Mutation(
        name="new_group_sent_no_manifest",
        item="42.5: a new generation's first version goes with its manifest",
        path="grpo/weights/collective/broadcaster.py",
        old="self.interface, self.timeout_s)\n        self._sent = None\n",
        new="self.interface, self.timeout_s)\n",
        tests=(
            f"{GROUP}::test_a_stalled_member_is_dropped_in_time_and_rejoins_when_it_moves_again",
        ),
    ),
    Mutation(
        name="header_of_a_version_never_sent_taken",
        item="42.5: a header cut like a version the member was never sent ends its membership",
        path="grpo/weights/collective/member.py",
        old="            if previous is None or len(sums) != len(previous.sums):",
        new="            if False:",
        tests=(f"{GROUP}::test_a_header_cut_like_a_version_never_sent_ends_the_membership",),
    ),
    Mutation(
        name="broadcast_bench_sends_nothing",
        item="42.7: bench.broadcast times buckets that arrive, checked byte for byte",
        path="bench/broadcast.py",
        old="                dist.broadcast(b, src=0)",
        new="                pass",
        tests=(
            "tests/test_gpu_check.py::test_the_weights_broadcast_is_timed_and_every_byte_checked",
        ),
    ),
    Mutation(
        name="close_waits_in_silence",
        item="42.3: a close that waits out a group's forming says so",
        path="grpo/weights/collective/broadcaster.py",
        old='            log.info(\n                "weights: closing once the collective group',
        new='            log.debug(\n                "weights: closing once the collective group',
        tests=(f"{GROUP}::test_closing_while_a_group_forms_says_what_it_waits_for",),
    ),
    Mutation(
        name="version_in_and_nobody_told",
        item="42.3: a sampler loads a streamed version as soon as it is in, not at the next "
        "heartbeat",
        path="grpo/weights/modes/stream.py",
        old="            changed=link.wake,\n",
        new="",
        tests=(
            f"{MODES}::test_each_mode_hands_the_sampler_the_version_the_trainer_published[stream]",
        ),
    ),
    Mutation(
        name="received_full_copy_taken_unchecked",
        item="62.1: a received full copy is taken whatever its check (made off the loop) said",
        path="grpo/weights/stream/client.py",
        old="                staged.result()\n",
        new="                pass\n",
        tests=(
            f"{TRUST}::test_a_relay_s_xxh3_equal_buckets_under_the_trainer_s_identity_are_refused",
            f"{RECEIVER}::test_a_full_copy_that_fails_its_checksum_is_asked_again_then_its_source_"
            "passed_over",
        ),
    ),
    Mutation(
        name="failed_fetch_a_stall_before_the_restart_shows",
        item="a fetch that failed just before the trainer's restart is heard stops the sampler",
        path="grpo/weights/in_use.py",
        old="            grace = 0.0 if self.version >= oldest else "
        "2 * self.cfg.transport.heartbeat_s\n",
        new="            grace = 0.0\n",
        tests=(
            "tests/test_weight_stream.py::"
            "test_a_failure_just_before_the_trainer_s_restart_shows_is_not_yet_a_stall",
        ),
    ),
    Mutation(
        name="failure_within_the_bound_never_retried",
        item="a sampler within the bound tries a failed version again once the trainer restarted",
        path="grpo/weights/in_use.py",
        old="            if not self._trainer_restarts(target, grace):\n",
        new="            if grace == 0 or not self._trainer_restarts(target, grace):\n",
        tests=(
            "tests/test_weight_stream.py::"
            "test_a_sampler_within_the_bound_tries_a_failed_version_again_after_a_restart",
        ),
    ),
    Mutation(
        name="engine_left_out_of_the_consumers",
        item="60.1: a version the sampler serves goes into the engine, not the HF policy alone",
        path="grpo/weights/in_use.py",
        old="            self.consumers.append(engine)\n",
        new="            pass\n",
        tests=(f"{MODES}::test_a_served_version_goes_into_every_consumer_that_samples_with_it",),
    ),
)
