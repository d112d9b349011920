"""Mutations of the defences of issue 62: findings 4 and 5 (a single bad message ended the run)
and finding 1 (a version's bucket sums were XXH3, forgeable under the trainer's identity). Each
puts back what the finding exploited and names the CI-tier tests that must then fail."""

from __future__ import annotations

from tests.mutations import Mutation

COLLECTIVE = "tests/test_weight_collective.py"
LAUNCH = "tests/test_launch_path.py"
FROM_SAMPLER = "tests/test_eval_from_sampler.py"
MUTATIONS = (
    Mutation(
        name="run_name_unchecked",
        item="62 (medium): name=base, name=spool or name=../x is a run dir again",
        path="grpo/config/rules.py",
        old="    check_name(cfg.name)\n",
        new="",
        tests=(
            "tests/test_config.py::test_a_run_name_that_is_not_one_fresh_path_component_is_refused",
        ),  # fmt: skip
    ),
    Mutation(
        name="slots_uncapped",
        item="62 (low): rollout.slots=10^12 is accepted again",
        path="grpo/config/sampling.py",
        old="    if r.slots > MAX_SLOTS:\n",
        new="    if False:\n",
        tests=("tests/test_config.py::test_absurd_integers_are_refused_before_the_run",),
    ),
    Mutation(
        name="empty_prompt_taken",
        item="62 (low): the prompts task takes an empty prompt again",
        path="grpo/tasks/prompts.py",
        old='        ok = (isinstance(prompt, str) and prompt.strip() != "") or (\n',
        new="        ok = isinstance(prompt, str) or (\n",
        tests=("tests/test_tasks.py::test_the_prompts_task_refuses_a_row_with_nothing_to_answer",),
    ),
    Mutation(
        name="restart_knobs_unchecked",
        item="62 (medium): GRPO_RESTART_DELAY_S=5s is read as 0 again",
        path="launch.sh",
        old="  [[ -z ${!knob:-} || ${!knob} =~ ^[0-9]{1,6}$ ]] || {\n",
        new="  true || {\n",
        tests=(f"{LAUNCH}::test_launch_sh_refuses_a_restart_setting_that_is_not_a_number",),
    ),
    Mutation(
        name="backoff_slept_in_the_foreground",
        item="62 (low): SIGTERM waits out a restart's backoff again",
        path="launch.sh",
        old='      sleep "$delay" &\n',
        new='      sleep "$delay"\n',
        tests=(f"{LAUNCH}::test_sigterm_ends_a_restart_backoff_at_once",),
    ),
    Mutation(
        name="unannounced_broadcast_held",
        item="62 (read-only finding): a broadcast replaces the held version unannounced",
        path="grpo/weights/stream/follower.py",
        old="image.version > self.held.version) and self._current(image):\n",
        new="image.version > self.held.version):\n",
        tests=(f"{COLLECTIVE}::test_an_unannounced_broadcast_does_not_replace_the_version_held",),
    ),
    Mutation(
        name="rendezvous_on_every_interface",
        item="62.3: the collective group's rendezvous listens on every interface again",
        path="grpo/weights/collective/rendezvous.py",
        old="        self._listener = socket.create_server((hostname, port), family=family, "
        "backlog=128)\n",
        new="        self._listener = socket.create_server(('', port), family=socket.AF_INET6, "
        "dualstack_ipv6=True)\n",
        tests=(f"{COLLECTIVE}::test_the_rendezvous_listens_on_the_configured_address_alone",),
    ),
    Mutation(
        name="rendezvous_keys_guessable",
        item="62.3: a generation's keys in the rendezvous are generation-G/... again, for anyone",
        path="grpo/weights/collective/group.py",
        old='    return f"generation-{generation}-{key}"\n',
        new='    return f"generation-{generation}"\n',
        tests=(f"{COLLECTIVE}::test_a_peer_without_the_generation_s_key_gets_no_seat",),
    ),
    Mutation(
        name="rendezvous_takes_any_key",
        item="62.2: the rendezvous takes keys outside the generation being formed, as TCPStore",
        path="grpo/weights/collective/rendezvous.py",
        old="            if self._prefix is None or not key.startswith(self._prefix):\n",
        new="            if False:\n",
        tests=(
            f"{COLLECTIVE}::test_a_peer_without_the_generation_s_key_gets_no_seat",
            f"{COLLECTIVE}::test_the_rendezvous_caps_what_one_generation_holds",
        ),
    ),
    Mutation(
        name="rendezvous_keys_uncounted",
        item="62.2: a generation's keys in the rendezvous are not capped in number",
        path="grpo/weights/collective/rendezvous.py",
        old="            elif key not in self._values and len(self._values) >= self._max_keys:\n",
        new="            elif False:\n",
        tests=(f"{COLLECTIVE}::test_the_rendezvous_caps_what_one_generation_holds",),
    ),
    Mutation(
        name="rendezvous_values_unbounded",
        item="62.2: the rendezvous reads a value of any size it is told",
        path="grpo/weights/collective/rendezvous.py",
        old="                if op not in (SET, GET) or key_len > MAX_KEY_BYTES or value_len > "
        "MAX_VALUE_BYTES:\n",
        new="                if op not in (SET, GET) or key_len > MAX_KEY_BYTES:\n",
        tests=(f"{COLLECTIVE}::test_the_rendezvous_caps_what_one_generation_holds",),
    ),
    Mutation(
        name="rendezvous_never_sealed",
        item="62.2: a formed generation's rendezvous still takes keys",
        path="grpo/weights/collective/broadcaster.py",
        old="        self.meeting.table.seal()  # every member formed its group: it took that "
        "header\n",
        new="",
        tests=(f"{COLLECTIVE}::test_every_version_reaches_every_member_bit_for_bit",),
    ),
    Mutation(
        name="rendezvous_connections_unbounded",
        item="62.2: the rendezvous serves any number of connections at once",
        path="grpo/weights/collective/rendezvous.py",
        old="        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)\n",
        new="        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS * 100)\n",
        tests=(f"{COLLECTIVE}::test_the_rendezvous_serves_a_bounded_number_of_connections",),
    ),
    Mutation(
        name="bucket_sums_back_to_xxh3",
        item="62.1: a version's bucket sums are XXH3-64 again, which a forger matches",
        path="grpo/weights/stream/frames.py",
        old="    return digest(parts)\n",
        new='    return format(checksum(parts), "064x")\n',
        tests=(
            "tests/test_weight_trust.py::"
            "test_a_relay_s_xxh3_equal_buckets_under_the_trainer_s_identity_are_refused",
            "tests/test_weight_collective.py::test_xxh3_equal_buckets_from_the_group_are_refused",
            "tests/test_weight_trust.py::"
            "test_a_bucket_s_digest_is_blake3_of_its_tensors_bytes_back_to_back",
        ),
    ),
    Mutation(
        name="stop_of_an_unknown_id_dropped",
        item="62.4: a stop with a malformed sampler_id is a KeyError again",
        path="grpo/delivery/pool.py",
        old="        if isinstance(sid, str) and self.is_from(sid, incarnation):\n",
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
    Mutation(
        name="stop_from_anyone",
        item="62.4: a stop in a lone sampler's name, from another process, ends the run again",
        path="grpo/delivery/pool.py",
        old="            and member.incarnation is not None\n"
        "            and incarnation == member.incarnation\n",
        new="",
        tests=(
            "tests/test_pool.py::test_a_stop_is_taken_only_from_the_process_heard_under_its_id",
            "tests/test_chaos.py::test_a_run_under_attack_ends_as_a_clean_run",
        ),
    ),
    Mutation(
        name="stop_before_heartbeat_lost",
        item="62.4: a sampler's stop that overtakes its first heartbeat is lost (a 900 s wait)",
        path="grpo/delivery/pool.py",
        old="(said := self.stops_waiting.pop((sid, member.incarnation), None))",
        new="(said := None)",
        tests=(
            "tests/test_pool.py::test_a_stop_is_taken_only_from_the_process_heard_under_its_id",
            "tests/test_transport.py::test_the_last_samplers_stop_ends_the_trainer_with_its_reason",
        ),
    ),
    Mutation(
        name="strangers_never_evicted",
        item="62.3/finding 6: made-up ids fill the pool for the trainer's life again",
        path="grpo/delivery/pool.py",
        old="        if len(strangers) >= MAX_UNVOUCHED:\n",
        new="        if len(self.members) >= MAX_MEMBERS:\n"
        "            return False\n"
        "        if False:\n",
        tests=(
            "tests/test_pool.py::"
            "test_a_flood_of_made_up_ids_never_keeps_a_real_sampler_out_nor_decides_the_run",
        ),
    ),
    Mutation(
        name="strangers_decide_none_left",
        item="62.3/finding 6: ids not vouched for keep a run whose samplers are gone alive again",
        path="grpo/delivery/pool.py",
        old="        judged = [m for m in self.members.values() if m.vouched] or "
        "list(self.members.values())\n",
        new="        judged = list(self.members.values())\n",
        tests=(
            "tests/test_pool.py::"
            "test_a_flood_of_made_up_ids_never_keeps_a_real_sampler_out_nor_decides_the_run",
        ),
    ),
    Mutation(
        name="strangers_stop_startup_clock",
        item="62.3/finding 6: heartbeats under made-up ids switch the start-up timeout off again",
        path="grpo/delivery/trainer_endpoint.py",
        old="        if not self.pool.any_vouched():\n",
        new="        if not self.pool.members:\n",
        tests=(
            "tests/test_transport.py::"
            "test_made_up_ids_heartbeating_do_not_switch_off_the_startup_timeout",
        ),
    ),
    Mutation(
        name="strangers_logged_each_time",
        item="62.5: every join and drop of a made-up id has its line again",
        path="grpo/delivery/pool.py",
        old="        if member.vouched:\n            log.log(level, message, *args)\n",
        new="        if True:\n            log.log(level, message, *args)\n",
        tests=(
            "tests/test_pool.py::"
            "test_a_flood_of_made_up_ids_never_keeps_a_real_sampler_out_nor_decides_the_run",
        ),
    ),
    Mutation(
        name="seq_window_off",
        item="62.4/finding 5: a batch numbered 2**40 is held (and its gap reported) again",
        path="grpo/delivery/trainer_endpoint.py",
        old="        elif (why := self.order.too_far(batch) or misfit(batch, self.expected)) "
        "is not None:\n",
        new="        elif (why := misfit(batch, self.expected)) is not None:\n",
        tests=(
            "tests/test_edge_validation.py::"
            "test_a_refused_batch_leaves_no_trace_and_the_real_one_is_taken",
        ),
    ),
    Mutation(
        name="seq_window_unbounded",
        item="62.4/finding 5: any seq fits the window",
        path="grpo/delivery/ordering.py",
        old="        if seq - first + 1 - trained_ahead <= self.max_held:\n",
        new="        if True:\n",
        tests=(
            "tests/test_delivery.py::"
            "test_a_seq_no_sampler_can_hold_unacknowledged_is_refused_before_it_is_held",
        ),
    ),
    Mutation(
        name="others_rejections_logged_each_time",
        item="62.5: each rejection of a batch a peer sent in the sampler's name is a line again",
        path="grpo/delivery/sampler_endpoint.py",
        old="                    log,\n                    self.others_rejected,\n",
        new="                    log,\n                    1,\n",
        tests=(
            "tests/test_edge_validation.py::"
            "test_rejections_of_batches_others_sent_in_its_name_cost_the_sampler_a_few_lines",
        ),
    ),
    Mutation(
        name="resume_reads_samples_whole",
        item="62 (low): a resume reads samples.jsonl to its start, not its tail",
        path="grpo/trainer/state.py",
        old="row.get(key, 0) > step):\n                break\n",
        new="row.get(key, 0) > step):\n                continue\n",
        tests=(
            "tests/test_delivery.py::"
            "test_truncate_metrics_reads_only_the_tail_and_cuts_where_a_whole_read_would",
        ),
    ),
    Mutation(
        name="runtime_error_is_a_config_error",
        item="62 (low): every runtime ValueError exits 2 again, which launch.sh never heals",
        path="grpo/cli.py",
        old="    return 2 if phase == STARTING else 1\n",
        new="    return 2\n",
        tests=(
            "tests/test_launch_path.py::test_a_role_s_error_is_a_config_error_only_while_it_starts",
        ),
    ),
    Mutation(
        name="failure_outlives_a_trainer_restart",
        item="62 (low): a version failure recorded while the trainer restarts sticks again",
        path="grpo/weights/in_use.py",
        old="            return status.restarts != restarts or status.version < target\n",
        new="            return status.version < target\n",
        tests=(
            "tests/test_weight_stream.py::"
            "test_a_version_that_failed_before_a_trainer_restart_is_tried_again_after_it",
        ),
    ),
    Mutation(
        name="any_incarnation_claims_a_restart",
        item="62.4: a heartbeat whose incarnation is no string (a list) brings a stopped one back",
        path="grpo/delivery/pool.py",
        old="    return value if isinstance(value, str) and len(value) <= INCARNATION_CHARS else "
        "None\n",
        new="    return value  # type: ignore[return-value]\n",
        tests=(
            "tests/test_pool.py::test_a_stop_is_taken_only_from_the_process_heard_under_its_id",
        ),
    ),
    Mutation(
        name="eval_answers_for_any_version",
        item="59/62: the trainer takes evaluation answers for a version it did not ask for",
        path="grpo/delivery/eval_answers.py",
        old="        if self.version is None or version != self.version:\n",
        new="        if self.version is None:\n",
        tests=(
            f"{FROM_SAMPLER}::test_the_trainer_takes_answers_only_for_the_version_it_asks_of_"
            "the_process_heard",
        ),  # fmt: skip
    ),
    Mutation(
        name="eval_answers_of_another_trainer",
        item="59/62: the trainer takes answers evaluated on another trainer process's version",
        path="grpo/delivery/eval_answers.py",
        old='        elif body.get("trainer") != trainer:\n',
        new="        elif False:\n",
        tests=(
            f"{FROM_SAMPLER}::test_the_trainer_takes_answers_only_for_the_version_it_asks_of_"
            "the_process_heard",
        ),  # fmt: skip
    ),
    Mutation(
        name="eval_answers_from_anyone",
        item="59/62: the trainer takes answers in the sampler's name from any process",
        path="grpo/delivery/eval_answers.py",
        old="        elif not (isinstance(sid, str)"
        ' and self.is_from(sid, body.get("incarnation"))):\n',
        new="        elif False:\n",
        tests=(
            f"{FROM_SAMPLER}::test_the_trainer_takes_answers_only_for_the_version_it_asks_of_"
            "the_process_heard",
        ),  # fmt: skip
    ),
    Mutation(
        name="eval_answers_out_of_vocabulary",
        item="59/62: a sampler's evaluation answer may hold token ids outside the vocabulary",
        path="grpo/eval/from_sampler.py",
        old="        if len(tokens) and not (tokens.min() >= 0 and tokens.max() < vocab_size):\n",
        new="        if False:\n",
        tests=(
            f"{FROM_SAMPLER}::test_answers_that_are_not_answers_to_the_trainers_questions_are_"
            "refused_by_name",
        ),  # fmt: skip
    ),
    Mutation(
        name="eval_asked_before_vouched",
        item="59: the trainer asks for evaluation answers before any batch vouched for a sampler",
        path="grpo/delivery/eval_answers.py",
        old="if self.version is not None and vouched else",
        new="if self.version is not None else",
        tests=(
            f"{FROM_SAMPLER}::test_the_trainer_takes_answers_only_for_the_version_it_asks_of_"
            "the_process_heard",
        ),  # fmt: skip
    ),
    Mutation(
        name="relays_from_any_vouched_sampler",
        item="62.3: without CURVE a relay is told for an id one forged batch vouched for",
        path="grpo/delivery/pool.py",
        old='m.incarnation or "", m.weights, self.authenticated or sid in self.relay_ids\n',
        new='m.incarnation or "", m.weights, True\n',
        tests=("tests/test_pool.py::test_without_curve_only_the_listed_samplers_relay",),
    ),
    Mutation(
        name="stream_end_tells_relays_the_pool_does_not_trust",
        item="60.3: the stream mode's trainer end names as relays only the samplers allowed to",
        path="grpo/weights/modes/stream.py",
        old='if m.may_serve and m.body.get("relay")',
        new='if m.body.get("relay")',
        tests=("tests/test_pool.py::test_without_curve_only_the_listed_samplers_relay",),
    ),
    Mutation(
        name="relay_samplers_not_wired",
        item="62.3: the trainer's pool never learns transport.relay_samplers",
        path="grpo/delivery/trainer_endpoint.py",
        old="relay_ids=frozenset(transport.relay_samplers)",
        new="relay_ids=frozenset()",
        tests=("tests/test_pool.py::test_without_curve_only_the_listed_samplers_relay",),
    ),
    Mutation(
        name="rejection_reason_in_the_clear",
        item="62.3: every subscriber of the control channel reads why a batch was rejected",
        path="grpo/delivery/trainer_endpoint.py",
        old="seq=batch.seq, **sealed\n",
        new="seq=batch.seq, reason=why, **sealed\n",
        tests=(
            "tests/test_edge_validation.py::"
            "test_a_rejected_batch_of_its_own_stops_the_sampler_and_stays_spooled",
        ),
    ),
    Mutation(
        name="rejection_opens_for_any_frames",
        item="62.3: a made-up rejection, or one of another peer's batch, stops the sampler",
        path="grpo/delivery/rejection.py",
        old="    if not hmac.compare_digest(tag, _tag(key)):\n        return None\n",
        new="",
        tests=(
            "tests/test_transport.py::test_a_rejected_batch_stops_only_the_sampler_that_sent_it",
            "tests/test_rejection.py::test_other_frames_do_not_open_it",
        ),
    ),
    Mutation(
        name="flipped_incarnation_invited_forever",
        item="62.6: a peer flipping its incarnation does not keep the group re-forming",
        path="grpo/weights/collective/membership.py",
        old="        return failed_incarnations[sid] < MAX_FAILED_INCARNATIONS\n",
        new="        return True\n",
        tests=(f"{COLLECTIVE}::test_who_the_next_group_holds",),
    ),
    Mutation(
        name="trickling_relay_never_passed_over",
        item="62 (read-only finding): a relay answering within the silence bound keeps a version",
        path="grpo/weights/stream/client.py",
        old="                    floor = time.monotonic() + allowed\n",
        new="                    floor = time.monotonic() + 1e9\n",
        tests=(
            "tests/test_weight_trust.py::"
            "test_a_relay_that_trickles_within_the_silence_bound_is_passed_over",
        ),
    ),
)
