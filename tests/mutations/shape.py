"""Mutations of the package's shape (issue 44, item 4): the error type in a leaf, cross-section
rules above the sections, and no circle of modules by any kind of import."""

from __future__ import annotations

from tests.mutations import Mutation

LAYERS = "tests/test_layers.py"
ABILITIES = "tests/test_engine_abilities.py"
LOOP = "tests/test_generation_loop.py"
GAE_TEST = (
    "tests/test_trainer_units.py::test_the_registered_gae_whitened_over_the_batch_equals_the_"
    "pure_gae"
)
OBJECTIVE = (
    "tests/test_passes.py::test_the_objective_adds_its_kl_term_and_subtracts_its_entropy_bonus"
)

MUTATIONS = (
    Mutation(
        name="section_imports_the_checks_back",
        item="44.4: the error type lives in a leaf; a section never imports the checks",
        path="grpo/config/algo.py",
        old="from grpo.config.errors import ConfigError\n",
        new="from grpo.config.rules import ConfigError\n",
        tests=(f"{LAYERS}::test_no_module_imports_one_that_imports_it_back",),
    ),
    Mutation(
        name="column_mapping_imports_the_tasks_back",
        item="44.4: no circle of modules, an import under TYPE_CHECKING included",
        path="grpo/tasks/columns.py",
        old="from grpo.config.data import Mapping\n",
        new="from grpo.config.data import Mapping\n\nif False:\n"
        "    from .base import Task  # noqa: F401\n",
        tests=(f"{LAYERS}::test_no_module_imports_one_that_imports_it_back",),
    ),
    Mutation(
        name="gdpo_declares_no_components",
        item="44.1: estimators declare their inputs; the trainer gives exactly those",
        path="grpo/algos/advantages.py",
        old='@register_advantage_estimator("gdpo", needs=("components",))',
        new='@register_advantage_estimator("gdpo")',
        tests=(
            "tests/test_algos_more.py::test_an_estimator_declares_what_it_needs",
            "tests/test_gdpo.py::test_the_trainer_reads_gsm8k_parts",
        ),
    ),
    Mutation(
        name="kl_control_never_adapts",
        item="44.1: the KL controller is built once from the config and adapts when asked",
        path="grpo/plan.py",
        old='    adaptive = algo.kl_in_reward and algo.kl_ctrl == "adaptive"\n',
        new="    adaptive = False\n",
        tests=(
            "tests/test_algos_more.py::test_the_kl_control_is_built_once_and_adapts_only_when_asked",
        ),
    ),
    Mutation(
        name="vllm_declared_without_its_log_probs",
        item="44.2: the checks ask an engine's declared abilities, not its name",
        path="grpo/config/engines.py",
        old="        reports_logprobs=True, continuous=True, adapters_in_memory=False, "
        "tensor_parallel=True\n",
        new="        reports_logprobs=False, continuous=True, adapters_in_memory=False, "
        "tensor_parallel=True\n",
        tests=(f"{ABILITIES}::test_the_checks_ask_the_abilities",),
    ),
    Mutation(
        name="engine_spans_one_gpu_whatever_it_declares",
        item="44.2: the placement asks an engine's declared abilities, not its name",
        path="grpo/config/engines.py",
        old="        return rollout.vllm.tensor_parallel_size if self.tensor_parallel else 1\n",
        new="        return 1\n",
        tests=(f"{ABILITIES}::test_an_engine_spans_the_gpus_its_abilities_say",),
    ),
    Mutation(
        name="a_step_stage_takes_the_config",
        item="44.1: no function of a step takes the Config (each reads its plan)",
        path="grpo/trainer/scoring.py",
        old="    plan: ScoringPlan,\n",
        new="    plan: Config,\n",
        tests=(f"{LAYERS}::test_no_function_of_a_step_takes_the_config",),
    ),
    Mutation(
        name="experience_plan_drops_the_shaping",
        item="44.1: the run plan's reward shaping reaches the experience",
        path="grpo/plan.py",
        old="        shaping=(Overlong(",
        new="        shaping=() and (Overlong(",
        tests=("tests/test_trainer_units.py::test_dapo_shaping_and_truncation_mask",),
    ),
    Mutation(
        name="objective_without_its_kl_term",
        item="44.1: the objective's KL coefficient is the config's",
        path="grpo/plan.py",
        old="        kl_coef=algo.kl_loss_coef,\n",
        new="        kl_coef=0.0,\n",
        tests=(OBJECTIVE,),
    ),
    Mutation(
        name="objective_without_its_entropy_bonus",
        item="44.1: the objective's entropy coefficient is the config's",
        path="grpo/plan.py",
        old="        entropy_coef=algo.entropy_coef,\n",
        new="        entropy_coef=0.0,\n",
        tests=(OBJECTIVE,),
    ),
    Mutation(
        name="token_versions_without_their_floor",
        item="44.3: the per-token table's bounds are what every received batch is checked against",
        path="grpo/core/tokens.py",
        old='"continuous generation", low=0),\n',
        new='"continuous generation"),\n',
        tests=(
            "tests/test_token_versions.py::test_the_trainer_refuses_versions_older_than_the_batch_"
            "claims_or_negative",
        ),
    ),
    Mutation(
        name="log_probs_left_unbounded",
        item="44.3: the per-token table says which arrays are bounded log-probs",
        path="grpo/core/tokens.py",
        old='"old_logp", "float32", ANSWER, True, "f", "sampler or trainer", bounded=True)',
        new='"old_logp", "float32", ANSWER, True, "f", "sampler or trainer")',
        tests=("tests/test_edge_validation.py::test_a_log_prob_out_of_range_is_refused_at_decode",),
    ),
    Mutation(
        name="a_failed_gathered_call_fails_every_request",
        item="44.4: one way to answer gathered requests: a failed call is retried per request",
        path="grpo/reward_service/batches.py",
        old="        if len(pending) > 1:\n",
        new="        if False:\n",
        tests=("tests/test_reward_service.py::test_one_bad_request_fails_only_itself",),
    ),
    Mutation(
        name="gathered_teacher_requests_at_one_temperature",
        item="44.4: gathered teacher requests at other temperatures are answered apart",
        path="grpo/reward_service/batches.py",
        old="            raise Split()\n",
        new="            pass\n",
        tests=(
            "tests/test_opd_service.py::test_requests_at_other_temperatures_gathered_together_"
            "each_get_their_own",
        ),
    ),
    Mutation(
        name="gae_declares_no_critic",
        item="44.1: GAE is a registered estimator whose declared inputs bring the critic",
        path="grpo/algos/registry.py",
        old='        return "values" in self.needs\n',
        new="        return False\n",
        tests=(GAE_TEST,),
    ),
    Mutation(
        name="critic_estimator_run_without_the_critic",
        item="44.1: an estimator of the critic's values is given the critic's values",
        path="grpo/trainer/experience.py",
        old='        given["values"] = values\n',
        new="        pass\n",
        tests=(GAE_TEST,),
    ),
    Mutation(
        name="gae_left_unwhitened",
        item="60.4: GAE's advantages, at the one place every estimator runs, are whitened",
        path="grpo/trainer/experience.py",
        old="        token_adv = masked_whiten(token_adv, exp.mask)\n",
        new="        pass\n",
        tests=(GAE_TEST,),
    ),
    Mutation(
        name="a_section_left_unchecked",
        item="44.4: each section's own check runs when a Config is built",
        path="grpo/config/rules.py",
        old="    check_transport(cfg.transport)\n",
        new="",
        tests=("tests/test_config.py::test_errors_name_the_key",),
    ),
    Mutation(
        name="a_stage_untimed",
        item="44.1: the step's stages are timed and reported through one instrumentation",
        path="grpo/runtime/progress.py",
        old="        with self(name), ACTIVITY.during(phase, detail):\n",
        new="        with ACTIVITY.during(phase, detail):\n",
        tests=(
            "tests/test_trainer_units.py::test_a_stage_of_the_step_is_timed_and_is_the_process_"
            "s_phase_meanwhile",
        ),
    ),
    Mutation(
        name="columns_padded_into_the_wrong_rows",
        item="44.3: a batch's columns become the trainer's (N, C) tensors in one scatter",
        path="grpo/core/batching.py",
        old="    rows = np.repeat(np.arange(len(lengths)), lengths)\n",
        new="    rows = np.repeat(np.arange(len(lengths))[::-1], lengths)\n",
        tests=("tests/test_trainer_units.py::test_a_column_is_padded_as_each_answer_would_be",),
    ),
    Mutation(
        name="lock_step_seeds_a_round_once",
        item="44.2: under lock-step a slot engine samples each answer from its own seed",
        path="grpo/sampler/pacing.py",
        old="            loop.start_group(engine, lambda uid: round_seed(seed, uid - first))\n",
        new="            loop.start_group(engine, lambda uid: seed)\n",
        tests=(f"{LOOP}::test_a_slot_engine_of_your_own_runs_both_pacings[lockstep]",),
    ),
    Mutation(
        name="continuous_pacing_loads_only_between_batches",
        item="44.2: continuous pacing loads the next version under the answers in flight",
        path="grpo/sampler/pacing.py",
        old="        batch = run.next_batch()[0] - 1 + self.ahead\n",
        new="        batch = run.next_batch()[0] - 1\n",
        tests=(f"{LOOP}::test_a_slot_engine_of_your_own_runs_both_pacings[continuous]",),
    ),
    Mutation(
        name="a_plugin_engine_s_abilities_ignored",
        item="44.2: the config's checks ask what an engine's factory declares, never its name",
        path="grpo/config/engines.py",
        old='    if ":" not in backend:\n',
        new="    if True:\n",
        tests=(f"{ABILITIES}::test_the_checks_ask_the_abilities",),
    ),
    Mutation(
        name="a_tool_call_ends_a_slot_answer",
        item="44.2: tools work under both pacings: a slot answer's next turn follows the result",
        path="grpo/rollout/tool_slots.py",
        old="        if going:\n",
        new="        if False:\n",
        tests=(
            "tests/test_tool_slots.py::test_the_same_answers_as_the_whole_batch_loop[full]",
            f"{LOOP}::test_tools_under_both_pacings[build_slots-continuous]",
        ),
    ),
    Mutation(
        name="a_resumed_slot_answer_restarts_its_turn",
        item="44.2: a resumed multi-turn answer goes on from its current turn",
        path="grpo/rollout/tool_slots.py",
        old="len(answer.mask) - answer.mask[::-1].index(0) if 0 in answer.mask else 0",
        new="0",
        tests=(
            "tests/test_tool_slots.py::test_a_resume_mid_answer_goes_on_as_the_answer_that_was_"
            "not_interrupted",
        ),
    ),
    Mutation(
        name="lock_step_admits_a_round_at_once",
        item="44.2: lock-step fills an engine smaller than its batch as slots free up",
        path="grpo/sampler/pacing.py",
        old="        while self.unadmitted and len(engine.free_slots()) >= self.G:\n",
        new="        while self.unadmitted:\n",
        tests=(f"{LOOP}::test_lock_step_fills_an_engine_smaller_than_its_batch_as_slots_free_up",),
    ),
    Mutation(
        name="a_step_is_no_progress",
        item="44.2: every engine's step is progress for the stall check, whatever the engine",
        path="grpo/sampler/generation.py",
        old="        ACTIVITY.tick()  # a step is progress",
        new="        pass  # a step is progress",
        tests=(f"{LOOP}::test_each_step_is_progress_in_generating_the_batch_being_made",),
    ),
    Mutation(
        name="generation_names_no_batch",
        item="44.2: a stalled generation is named with the batch being made",
        path="grpo/sampler/generation.py",
        old='ACTIVITY.enter(GENERATING, f"batch {self.seq}")',
        new='ACTIVITY.enter(GENERATING, f"{busy} answers in flight")',
        tests=(f"{LOOP}::test_each_step_is_progress_in_generating_the_batch_being_made",),
    ),
    Mutation(
        name="delivery_reads_a_mode_s_relays",
        item="60.8: delivery/ and wire/ import nothing of weights/stream or weights/collective",
        path="grpo/delivery/pool.py",
        old="from grpo.weights.modes.base import Vouched, sampler_body\n",
        new="from grpo.weights.modes.base import Vouched, sampler_body\n"
        "from grpo.weights.stream.relay import relay_members  # noqa: F401\n",
        tests=(f"{LAYERS}::test_the_delivery_and_the_wire_know_no_weights_mode",),
    ),
)
