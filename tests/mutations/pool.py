"""Mutations of the sampler pool (issue 43): what a peer can make the trainer hold or write,
bounded (finding 1's ids, finding 3's log lines), and what failed silently or spun (findings
4-6: an engine restart, a failing reward, rows)."""

from __future__ import annotations

from tests.mutations import Mutation

MUTATIONS = (
    Mutation(
        name="every_refusal_logged",
        item="43.1 (begun): refusals are logged at a bounded rate with their counts",
        path="grpo/runtime/refusals.py",
        old="    return count <= 10 or count & (count - 1) == 0",
        new="    return True",
        tests=(
            "tests/test_chaos.py::test_a_run_under_attack_ends_as_a_clean_run",
            "tests/test_wire_limits.py::test_refusals_are_logged_ten_times_then_at_each_power_of_"
            "two",
        ),
    ),
    Mutation(
        name="pool_takes_any_id",
        item="43.1 (begun): ids and the pool's size are bounded",
        path="grpo/delivery/pool.py",
        old="        if not is_sampler_id(sid):\n            return False\n",
        new="",
        tests=(
            "tests/test_pool.py::test_an_id_that_is_no_sampler_id_or_one_past_the_pool_s_bound_is_"
            "not_taken",
        ),
    ),
    Mutation(
        name="batch_with_any_sampler_id",
        item="43.1 (begun): a batch's sampler id is bounded",
        path="grpo/wire/codec.py",
        old='    require(is_sampler_id(header["sampler_id"]), f"sampler_id must be '
        '{SAMPLER_ID_RULE}")',
        new='    require(isinstance(header["sampler_id"], str), "sampler_id must be a str")',
        tests=(
            "tests/test_wire_limits.py::test_a_batch_whose_sampler_id_is_no_sampler_id_is_refused",
        ),
    ),
    Mutation(
        name="huge_row_tokenized",
        item="43.6: a row is capped by its characters before it is tokenized",
        path="grpo/tasks/encoding.py",
        old="    if max_tokens is not None and len(text) > max_tokens * MAX_CHARS_PER_TOKEN:",
        new="    if False:",
        tests=("tests/test_sampler_units.py::test_a_huge_row_is_skipped_without_being_tokenized",),
    ),
    Mutation(
        name="null_field_taken",
        item="43.6: a null field is refused with its row named",
        path="grpo/tasks/base.py",
        old="            if row[key] is None:",
        new="            if False:",
        tests=("tests/test_user_data.py::test_a_null_question_is_refused_naming_its_row",),
    ),
    Mutation(
        name="dataset_dir_escapes",
        item="43.6: a save_to_disk directory reads only files inside it",
        path="grpo/tasks/sources.py",
        old="        require_inside(path)\n",
        new="",
        tests=(
            "tests/test_user_data.py::test_a_save_to_disk_directory_reads_only_files_inside_it",
        ),
    ),
    Mutation(
        name="reward_failures_never_stop",
        item="43.5: a reward failing above reward.max_error_rate stops the sampler",
        path="grpo/tasks/failures.py",
        old="        if (seen >= self.least or every_one) and failed > self.bound * seen:",
        new="        if False:",
        tests=(
            "tests/test_user_rewards.py::test_a_reward_failing_on_most_answers_stops_the_sampler_"
            "naming_it_and_its_first_error",
        ),
    ),
    Mutation(
        name="reward_signature_unchecked",
        item="43.5: a reward with the wrong signature is refused when loaded",
        path="grpo/tasks/conventions.py",
        old="        bind(*args, **keywords)",
        new="        pass",
        tests=(
            "tests/test_user_rewards.py::test_a_reward_with_the_wrong_signature_is_refused_when_"
            "loaded",
        ),
    ),
    Mutation(
        name="every_reward_failure_logged",
        item="43.5: a failing reward's log lines are bounded",
        path="grpo/tasks/base.py",
        old="        _failures += 1",
        new="        _failures = 1",
        tests=(
            "tests/test_tasks.py::test_a_reward_failing_on_every_answer_writes_a_bounded_number_"
            "of_lines",
        ),
    ),
    Mutation(
        name="vllm_restart_drops_answers_in_flight",
        item="43.4: an engine restart in continuous vLLM keeps the answers in flight",
        path="grpo/rollout/vllm_slots.py",
        old="        super()._restart(vdir)\n        self.restore(answers)\n",
        new="        super()._restart(vdir)\n",
        tests=(
            "tests/test_vllm_continuous.py::test_an_engine_restart_carries_the_answers_in_flight_"
            "over",
        ),
    ),
    Mutation(
        name="any_version_claim_admitted",
        item="43.2: a version the run never publishes for sampling is refused on arrival",
        path="grpo/delivery/admission.py",
        old="    if v < 0 or v % every or (last is not None and v > last):",
        new="    if False:",
        tests=(
            "tests/test_staleness.py::test_a_version_the_run_never_publishes_for_sampling_is_refused_when_it_arrives",
        ),
    ),
    Mutation(
        name="future_version_within_the_bound",
        item="43.2: no batch is trained that claims weights newer than the trainer's",
        path="grpo/core/staleness.py",
        old="    if version > step:",
        new="    if False:",
        tests=(
            "tests/test_staleness.py::test_the_trainer_takes_exactly_the_versions_the_sampler_waits_for",
        ),
    ),
    Mutation(
        name="staleness_bound_not_enforced",
        item="43.2: the trainer enforces the staleness bound when it trains a batch",
        path="grpo/delivery/admission.py",
        old="        if why is None or lone:\n            return why\n",
        new="        if True:\n            return None\n",
        tests=(
            "tests/test_staleness.py::test_a_lone_sampler_outside_the_bound_is_refused_and_a_pool_s_is_counted",
            "tests/test_staleness.py::test_a_lone_sampler_lying_about_its_version_is_stopped_by_the_trainer",
        ),
    ),
    Mutation(
        name="lone_sampler_taken_for_a_pool",
        item="43.2: a lone sampler's batch outside the bound is refused, not counted",
        path="grpo/delivery/admission.py",
        old="        lone = ledger.consumed.keys() | set(held) <= {batch.sampler_id}",
        new="        lone = False",
        tests=(
            "tests/test_staleness.py::test_a_lone_sampler_lying_about_its_version_is_stopped_by_the_trainer",
        ),
    ),
    Mutation(
        name="heartbeats_vouch_for_any_id",
        item="43.1: a sampler counts (pacing, relays, the group, byes) only once vouched for",
        path="grpo/delivery/pool.py",
        old="            member.vouched = self.authenticated or sid in self.trusted",
        new="            member.vouched = True",
        tests=("tests/test_pool.py::test_a_sampler_heard_of_counts_only_once_vouched_for",),
    ),
    Mutation(
        name="admitted_batch_vouches_for_no_one",
        item="43.1: an admitted batch vouches for its sampler",
        path="grpo/delivery/trainer_endpoint.py",
        old="            self.pool.vouch(batch.sampler_id)",
        new="            self.pool.heard(batch.sampler_id)",
        tests=("tests/test_staleness.py::test_a_batch_admitted_vouches_for_its_sampler",),
    ),
    Mutation(
        name="launch_sh_never_restarts",
        item="43.4: launch.sh restarts a role that dies",
        path="launch.sh",
        old="    if ((code != 2 && restarts[$role] < MAX_RESTARTS)); then",
        new="    if false; then",
        tests=(
            "tests/test_chaos.py::test_launch_sh_heals_a_sigkilled_sampler_and_trainer_rank",
            "tests/test_launch_path.py::test_launch_sh_restarts_a_dying_role_a_bounded_number_of_times[1-3]",
        ),
    ),
    Mutation(
        name="launch_sh_restarts_a_config_error",
        item="43.4: a usage or config error (exit code 2) is not restarted",
        path="launch.sh",
        old="    if ((code != 2 && restarts[$role] < MAX_RESTARTS)); then",
        new="    if ((restarts[$role] < MAX_RESTARTS)); then",
        tests=(
            "tests/test_launch_path.py::test_launch_sh_restarts_a_dying_role_a_bounded_number_of_times[2-1]",
        ),
    ),
    Mutation(
        name="healed_trainer_stops_the_samplers",
        item="43.4: a trainer that launch.sh will restart leaves the samplers running",
        path="grpo/trainer/loop.py",
        old="            if interrupted or not restarts_left():",
        new="            if True:",
        tests=("tests/test_chaos.py::test_launch_sh_heals_a_sigkilled_sampler_and_trainer_rank",),
    ),
    Mutation(
        name="restarts_not_counted",
        item="43.4: the metrics row counts the restarts",
        path="grpo/trainer/loop.py",
        old='                "trainer_restarts": restarts(),',
        new='                "trainer_restarts": 0,',
        tests=("tests/test_chaos.py::test_launch_sh_heals_a_sigkilled_sampler_and_trainer_rank",),
    ),
    Mutation(
        name="pool_size_not_in_the_metrics",
        item="43.3: the metrics row shows the pool over time",
        path="grpo/delivery/trainer_endpoint.py",
        old='            "samplers_alive": len(self.pool.counted()),',
        new='            "samplers_alive": 1,',
        tests=(
            "tests/test_multi_sampler.py::test_a_sampler_joins_mid_run_and_one_leaves_and_every_"
            "step_is_trained",
        ),
    ),
    Mutation(
        name="curve_keys_read_once",
        item="43.3: under CURVE a sampler whose key is added during the run joins it",
        path="grpo/wire/keys.py",
        old="            if (files := self._files()) != self.read_files:",
        new="            if False:",
        tests=(
            "tests/test_curve.py::test_a_sampler_whose_key_is_added_during_the_run_joins_it",
            "tests/test_curve.py::test_authorized_keys_are_read_again_on_any_change",
        ),
    ),
    Mutation(
        name="newest_token_version_unchecked",
        item="43.2: no token is trained that claims weights newer than the trainer's",
        path="grpo/core/staleness.py",
        old="    if newest is not None and newest > step:",
        new="    if False:",
        tests=(
            "tests/test_staleness.py::test_the_trainer_takes_exactly_the_versions_the_sampler_"
            "waits_for",
        ),
    ),
    Mutation(
        name="reward_checked_only_at_the_first_batch",
        item="43.5: a bad reward is refused before any model loads",
        path="grpo/preflight.py",
        old="            run_reward(task, cfg.data.reward)\n",
        new="            pass\n",
        tests=(
            "tests/test_launch_path.py::test_help_exits_0_and_a_bad_reward_is_refused_before_"
            "any_model_loads",
        ),
    ),
    Mutation(
        name="launch_checks_nothing_a_run_opens",
        item="45.1 (in part): what a run opens is checked before any role starts",
        path="grpo/cli.py",
        old="        preflight(cfg, role)  # and what the roles it starts will open\n",
        new="",
        tests=(
            "tests/test_integration.py::test_what_a_run_opens_is_checked_before_any_role_starts",
        ),
    ),
)
