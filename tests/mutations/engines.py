"""Mutations of the engines' stop strings and of the plugins' lookup (issue 33, items 3 and 6).

Item 3: either engine ending its answers anywhere but right after a stop string turns the vLLM
stop-string test red. Item 6: the built-in loss or task used in place of the toy ones a config
names turns the toy run red.
"""

from __future__ import annotations

from tests.mutations import Mutation

STOP_TEST = "tests/test_vllm.py::test_stop_strings_end_answers_like_hf"
STREAMED_TEST = "tests/test_vllm.py::test_streamed_tensors_are_served_in_place"
BAD_FILE_TEST = "tests/test_vllm.py::test_a_bad_file_is_refused_before_the_model_is_touched"
BINDING_TEST = "tests/test_vllm.py::test_the_engine_runs_on_the_sampler_s_cores_with_none_reserved"
RELOAD_TEST = "tests/test_vllm.py::test_in_place_reload_serves_the_new_weights"
PLUGIN_RUN = "tests/test_plugins.py::test_a_run_with_the_toy_plugins_and_a_served_reward_model"
PLUGIN_PLAN = "tests/test_plugins.py::test_the_run_s_plan_and_reward_are_the_plugins"  # CI's tier
PLUGIN_TASK = "tests/test_plugins.py::test_toy_task_is_found_and_scores"

MUTATIONS = (
    Mutation(
        name="vllm_keeps_a_core_for_its_scheduler",
        item="58/59: the demo's vLLM generates on both cores",
        path="grpo/rollout/vllm.py",
        old='        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",\n',
        new='        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",\n',
        tests=(
            "tests/test_vllm_binding.py::test_all_the_sampler_s_cores_none_reserved",
            BINDING_TEST,
        ),
    ),
    Mutation(
        name="vllm_binding_never_set",
        item="58/59: the binding reaches the engine",
        path="grpo/rollout/vllm.py",
        old="            os.environ.update(cpu_binding(",
        new="            dict(cpu_binding(",
        tests=(BINDING_TEST,),
    ),
    Mutation(
        name="vllm_ignores_stop_strings",
        item="3: the stop strings fire in vLLM",
        path="grpo/rollout/vllm.py",
        old="            stop=list(sampling.stop) or None,\n",
        new="            stop=None,\n",
        tests=(STOP_TEST,),
    ),
    Mutation(
        name="hf_keeps_what_follows_a_stop_string",
        item="3: vLLM's answers are compared with HF's",
        path="grpo/rollout/hf.py",
        old="completion, reason = _cut_at_stop(completion, reason, self.tokenizer, stop)",
        new="completion, reason = completion, reason",
        tests=(STOP_TEST,),
    ),
    Mutation(
        name="built_in_loss_for_a_plugin_one",
        item="6: the toy loss leaves its own metric",
        path="grpo/plan.py",  # where the trainer's loss is looked up, once
        old='fn = _looked_up("algo.loss", get_policy_loss, algo.loss)',
        new='fn = _looked_up("algo.loss", get_policy_loss, "grpo")',
        tests=(PLUGIN_PLAN, PLUGIN_RUN),
    ),
    Mutation(
        name="built_in_task_for_a_plugin_one",
        item="6: the toy task's prompts show in the run",
        path="grpo/tasks/base.py",
        old="get_task = TASKS.get",
        new='get_task = lambda name: TASKS.get("gsm8k" if ":" in name else name)  # noqa: E731',
        tests=(PLUGIN_TASK, PLUGIN_RUN),
    ),
    Mutation(
        name="built_in_reward_for_a_plugin_task",
        item="6: the toy task's rewards show in the run",
        path="grpo/tasks/base.py",
        old="    return load_reward_fn(spec) if spec else task.reward\n",
        new='    return load_reward_fn(spec) if spec else get_task("gsm8k").reward\n',
        tests=(PLUGIN_PLAN, PLUGIN_RUN),
    ),
    Mutation(
        name="layerwise_reload_before_the_files_are_checked",
        item="42.1: a version is loaded into vLLM all or nothing",
        path="grpo/rollout/vllm_worker.py",
        old="""        handles = open_checked(update_info.files)
        initialize_layerwise_reload(self.model)
""",
        new="""        initialize_layerwise_reload(self.model)
        handles = open_checked(update_info.files)
""",
        tests=(BAD_FILE_TEST,),
    ),
    Mutation(
        name="transfer_engine_reports_no_version",
        item="42.1: the sampler checks what vLLM's workers loaded",
        path="grpo/rollout/vllm_worker.py",
        old="        self.loaded, self._received = self._received, None\n",
        new="        self._received = None\n",
        tests=(RELOAD_TEST, STREAMED_TEST),
    ),
    Mutation(
        name="lm_head_not_retied_after_a_transfer",
        item="42.1: a streamed version reaches the tied LM head in vLLM",
        path="grpo/rollout/vllm_worker.py",
        old="        retie_lm_head(self.model, self.model_config.hf_config)\n",
        new="",
        tests=(STREAMED_TEST, RELOAD_TEST),
    ),
    Mutation(
        name="memfd_tensors_at_the_wrong_offsets",
        item="42.1: the memory file holds each tensor at its header's offsets",
        path="grpo/rollout/vllm_transfer.py",
        old="                    view[start + lo : start + hi].copy_(flat)\n",
        new="                    view[lo:hi].copy_(flat)\n",
        tests=(STREAMED_TEST,),
    ),
    Mutation(
        name="hf_slot_load_keeps_the_old_version",
        item="60.2: an engine learns a version in one call, load (the HF slot engine)",
        path="grpo/rollout/hf_slots.py",
        old="        self.version = version.number\n        if self.kv_on_update",
        new="        if self.kv_on_update",
        tests=(
            "tests/test_hf_continuous.py::"
            "test_a_version_changing_mid_answer_shows_in_each_tokens_version_and_logprob",
        ),
    ),
    Mutation(
        name="vllm_slot_load_leaves_the_answers_in_flight",
        item="60.2: vLLM's slot engine moves the answers in flight onto what load loaded",
        path="grpo/rollout/vllm_slots.py",
        old="        how = super().load(version)\n        self._serve_in_flight(version.number)\n",
        new="        how = super().load(version)\n",
        tests=("tests/test_vllm_continuous.py::test_a_version_changes_mid_answer",),
    ),
    Mutation(
        name="generate_slots_load_keeps_the_old_version",
        item="60.2: lock-step's slot engine learns the version its load was given",
        path="grpo/rollout/generate_slots.py",
        old="        self.version = version.number\n        return how\n",
        new="        return how\n",
        tests=("tests/test_integration.py::test_three_steps_two_ranks_with_reloads",),
    ),
)
