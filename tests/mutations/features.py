"""Mutations of what the last round added (issue 41): continuous generation, mixtures, OPD,
the rollout-correction bands, user rewards, token versions, decoupled PPO, GDPO and durable
state. Each switches the feature off or degrades it silently, as a bug would, and names the
CI-tier tests that must then fail."""

from __future__ import annotations

from tests.mutations import Mutation

RUNS = "tests/test_continuous_runs.py"
LAG2 = f"{RUNS}::test_answers_span_versions_within_the_bound_and_the_loss_weights_their_tokens"
LAG0 = f"{RUNS}::test_on_policy_continuous_paces_admission_and_samples_each_batch_with_one_version"

MUTATIONS = (
    Mutation(
        name="continuous_engine_samples_frozen_weights",
        item="41.1: the weights that sampled each token are the version its stamp names",
        path="grpo/rollout/hf_slots.py",
        old="        ctx.policy.module(),\n",
        new='        __import__("copy").deepcopy(ctx.policy.module()),\n',
        tests=(LAG0, LAG2),
    ),
    Mutation(
        name="continuous_slots_refill_in_waves",
        item="41.1: slots refill as they free up, not when the engine is empty",
        path="grpo/sampler/pacing.py",
        old="        wanted = run.groups_wanted()\n",
        new="        wanted = 0 if engine.in_flight() else run.groups_wanted()\n",
        tests=(LAG2,),
    ),
    Mutation(
        name="mixture_weights_ignored",
        item="41.1: a mixture draws each entry at its configured share",
        path="grpo/sampler/data.py",
        old="weights = [len(p.rows) for p in self.parts], [p.weight for p in self.parts]",
        new="weights = [len(p.rows) for p in self.parts], [1.0 for p in self.parts]",
        tests=(
            "tests/test_mixtures.py::test_a_mixture_shard_draws_each_entry_at_the_configured_share",
        ),
    ),
    Mutation(
        name="opd_reward_weight_ignored",
        item="41.1: algo.opd_reward_weight reaches the trainer's advantages",
        path="grpo/plan.py",
        old='"teacher": {"reward_weight": algo.opd_reward_weight}}',
        new='"teacher": {"reward_weight": 0.0}}',
        tests=(
            "tests/test_opd.py::test_the_trainer_adds_the_reward_advantage_with_the_configured_weight",
        ),
    ),
    Mutation(
        name="opd_teacher_at_temperature_one",
        item="41.1: the teacher scores at the sampling temperature",
        path="grpo/sampler/episodes.py",
        old="            self.sampling.temperature,\n        )\n",
        new="            1.0,\n        )\n",
        tests=("tests/test_opd.py::test_the_sampler_asks_the_teacher_at_the_sampling_temperature",),
    ),
    Mutation(
        name="geo_rs_band_from_the_config_ignored",
        item="41.1: every correction band arrives from the config",
        path="grpo/config/algo.py",
        old='            "geo_rs": self.rollout_geo_rs_band,\n',
        new='            "geo_rs": [0.999, 1.001],\n',
        tests=(
            "tests/test_rollout_corr.py::test_every_band_arrives_from_the_config_at_the_trainer",
        ),
    ),
    Mutation(
        name="user_reward_replaced_by_the_task_checker",
        item="41.1: the user's verl / TRL function scores every answer of a run",
        path="grpo/tasks/base.py",
        old="    return load_reward_fn(spec) if spec else task.reward\n",
        new="    return task.reward\n",
        tests=(
            "tests/test_user_data.py::test_a_run_on_gsm8k_in_verls_schema_with_a_verl_compute_score",
            "tests/test_user_rewards.py::test_a_run_with_a_trl_reward_over_a_dataset_directory",
        ),
    ),
    Mutation(
        name="token_versions_older_than_the_claim_admitted",
        item="41.1: a batch's tokens are no older than the version it claims",
        path="grpo/core/columns.py",
        old="    bad = np.flatnonzero(oldest < policy_version)\n",
        new="    bad = np.flatnonzero(oldest < 0)\n",
        tests=(
            "tests/test_token_versions.py::test_the_trainer_refuses_versions_older_than_the_batch_claims_or_negative",
        ),
    ),
    Mutation(
        name="decoupled_caps_instead_of_dropping",
        item="41.1: decoupled PPO drops the tokens over its cap, as AReaL",
        path="grpo/algos/correction.py",
        old="        weights = torch.where(over, torch.zeros_like(ratio), ratio)\n",
        new="        weights = ratio.clamp(max=threshold)\n",
        tests=("tests/test_decoupled.py::test_the_trainer_s_loss_is_areal_s_decoupled_ppo",),
    ),
    Mutation(
        name="gdpo_normalises_the_sum",
        item="41.1: GDPO normalises each part apart",
        path="grpo/algos/advantages.py",
        old="sum(group_advantages(part, group_size, eps=eps) for part in parts.unbind(dim=-1))",
        new="group_advantages(parts.sum(dim=-1), group_size, eps=eps)",
        tests=("tests/test_gdpo.py::test_tells_apart_what_grpo_collapses",),
    ),
    Mutation(
        name="state_file_not_fsynced",
        item="41.1: a saved state's files are fsynced before its marker names them",
        path="grpo/core/durable.py",
        old="        os.fsync(f.fileno())\n",
        new="        pass\n",
        tests=(
            "tests/test_durable_state.py::test_files_and_dirs_are_fsynced_before_the_marker_names_them",
        ),
    ),
    Mutation(
        name="convert_leaves_gguf_patched",
        item="59.2: the one-parse conversion leaves the gguf module as it found it",
        path="grpo/models/convert.py",
        old="        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map\n",
        new="        pass\n",
        tests=(
            "tests/test_convert.py::"
            "test_within_the_block_the_file_is_parsed_once_and_after_it_gguf_is_as_it_was",
        ),
    ),
    Mutation(
        name="memfd_closed_under_a_timed_out_reload",
        item="62.6: a streamed version's memory file outlives a reload that timed out",
        path="grpo/rollout/vllm.py",
        old="        self._load_in_workers(\n"
        "            [memfd_path(fd)], version, lambda n: n == len(state), "
        "release=lambda: os.close(fd)\n        )\n",
        new="        try:\n"
        "            self._load_in_workers([memfd_path(fd)], version, lambda n: n == len(state))\n"
        "        finally:\n            os.close(fd)\n",
        tests=(
            "tests/test_vllm_reload.py::"
            "test_the_memory_file_stays_open_until_a_timed_out_transfer_ends",
        ),
    ),
)
