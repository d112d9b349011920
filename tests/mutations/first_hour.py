"""Mutations of what a new user meets first (issue 45): the preflight's checks of ports, keys
and what the node can run."""

from __future__ import annotations

from tests.mutations import Mutation

TESTS = "tests/test_preflight.py::"
PORT = TESTS + "test_a_port_another_process_holds_is_named_with_the_process"
OPEN = TESTS + "test_listening_beyond_loopback_needs_keys_or_a_word"
KEYS = TESTS + "test_each_role_s_keys_are_read_before_it_starts"
ROWS = TESTS + "test_a_dataset_s_rows_are_read_as_the_sampler_will_read_them"
HUB = TESTS + "test_a_hub_id_is_taken_from_the_local_cache_and_never_downloaded"
PROJECT = "tests/test_launch_path.py::test_a_run_started_from_a_project_dir_finds_its_files_there"
SAMPLES = "tests/test_evaluation.py::test_each_step_writes_its_best_and_worst_answers_as_text"
REFERENCE = "tests/test_integration.py::test_three_steps_two_ranks_with_reloads"
BARE = "tests/test_evaluation.py::test_a_reward_that_reports_no_parts_shows_no_accuracy_or_format"
MERGE = "tests/test_merge_lora.py::"
NODE = TESTS + "test_the_attention_kernel_and_the_ranks_must_fit_the_node"
LAUNCH = "tests/test_launch_path.py::"
OPENED = TESTS + "test_what_the_run_opens_past_the_model_dir_is_opened_first"
SUMMARY = "tests/test_reward_runner.py::test_the_closing_summary_names_what_the_run_made_with_" \
    "absolute_paths"  # fmt: skip
COMMAND = "tests/test_grpo_command.py::"
STEP_LINE = "tests/test_step_line.py::"
BASH = "tests/test_docs.py::test_the_bash_the_docs_ask_for_is_the_one_launch_sh_checks_for"
CLEAN = "tests/test_clean.py::test_clean_removes_the_runs_moved_aside_keeping_the_newest"
GROUPS = "tests/test_evaluation.py::test_a_step_s_numbers_go_to_the_tracker_group_they_belong_to"
BASE_NAMED = (
    "tests/test_weight_modes.py::test_a_published_adapter_names_a_base_another_machine_finds["
)
HELP = LAUNCH + "test_help_exits_0_and_a_bad_reward_is_refused_before_any_model_loads"

MUTATIONS = (
    Mutation(
        name="ports_not_probed",
        item="45.1: a port in use is named before any model loads",
        path="grpo/preflight.py",
        old="        _port_free(key, addr)\n",
        new="        pass\n",
        tests=(PORT,),
    ),
    Mutation(
        name="every_trainer_rank_probes_the_ports",
        item="45.1: only trainer rank 0 (which listens) probes its ports",
        path="grpo/preflight.py",
        old='    return cfg.train.node_rank == 0 and os.environ.get("RANK", "0") == "0"\n',
        new="    return True\n",
        tests=(PORT,),
    ),
    Mutation(
        name="open_addresses_left_to_the_channel",
        item="45.1: listening beyond loopback without keys is refused before any model loads",
        path="grpo/preflight.py",
        old="            check_listening(listening, bool(t.curve_dir), allow_insecure=False)\n",
        new="            pass\n",
        tests=(OPEN,),
    ),
    Mutation(
        name="keys_not_read_before_the_start",
        item="45.1: a missing or unsafe key is named before any model loads",
        path="grpo/preflight.py",
        old="            ClientKeys.load(directory, cfg.rollout.sampler_id)\n",
        new="            pass\n",
        tests=(KEYS,),
    ),
    Mutation(
        name="varlen_attention_allowed_without_a_gpu",
        item="45.1: flex_attention without a GPU is refused before any model loads",
        path="grpo/preflight.py",
        old='    if not visible_gpus():\n        raise ConfigError(\n            f"model.attn',
        new='    if False:\n        raise ConfigError(\n            f"model.attn',
        tests=(NODE,),
    ),
    Mutation(
        name="cpu_ranks_unbounded",
        item="45.1: more trainer ranks than cores is refused",
        path="grpo/preflight.py",
        old="    if num_ranks > (cores or 1):\n",
        new="    if num_ranks > 64 * (cores or 1):\n",
        tests=(NODE,),
    ),
    Mutation(
        name="dataset_rows_left_to_the_sampler",
        item="45.1: a dataset without the task's columns is refused before any model loads",
        path="grpo/preflight.py",
        old="        task.load(source)\n",
        new="        pass\n",
        tests=(ROWS,),
    ),
    Mutation(
        name="user_dir_not_recorded_by_launch",
        item="45.4: a run started from a project dir finds its files there",
        path="launch.sh",
        old="export GRPO_USER_DIR=${GRPO_USER_DIR:-$PWD}\n",
        new="",
        tests=(PROJECT,),
    ),
    Mutation(
        name="hub_cache_not_looked_in",
        item="45.3: a hub id is taken from the local cache",
        path="grpo/models/embedded.py",
        old="        cached = _cached_snapshot(path)\n",
        new="        cached = None\n",
        tests=(HUB,),
    ),
    Mutation(
        name="samples_in_batch_order",
        item="45.2: each step's best and worst answers are written",
        path="grpo/observe/samples.py",
        old='    order = np.argsort(-rewards, kind="stable")\n',
        new="    order = np.arange(len(rewards))\n",
        tests=(SAMPLES, REFERENCE),
    ),
    Mutation(
        name="samples_never_written",
        item="45.2: the answers reach samples.jsonl in a real run",
        path="grpo/trainer/loop.py",
        old="                self.run_log.step(self.step(step, batch, seconds), batch)\n",
        new="                self.run_log.step(self.step(step, batch, seconds))\n",
        tests=(REFERENCE,),
    ),
    Mutation(
        name="unreported_rates_shown_as_zero",
        item="45.5: no accuracy or format for a reward that reports neither",
        path="grpo/observe/metrics.py",
        old="        if any(key in i for i in infos)\n",
        new="",
        tests=(BARE,),
    ),
    Mutation(
        name="lr_schedule_not_given_to_deepspeed",
        item="45.5: the learning rate follows train.lr_schedule with its warmup",
        path="grpo/trainer/engines.py",
        old="        lr_scheduler=scheduler_for(cfg, world),\n",
        new="",
        tests=("tests/test_schedule.py::test_the_policy_engine_follows_the_schedule",),
    ),
    Mutation(
        name="warmup_starts_at_full_lr",
        item="45.5: the warmup rises from 0",
        path="grpo/trainer/schedule.py",
        old="        return (step + 1) / warmup\n",
        new="        return 1.0\n",
        tests=("tests/test_schedule.py::test_warmup_then_each_schedule_ends_at_its_floor",),
    ),
    Mutation(
        name="merge_drops_the_adapter",
        item="45.3: merge-lora folds the adapter into its base",
        path="grpo/models/merge.py",
        old=".merge_and_unload()",
        new=".unload()",
        tests=(MERGE + "test_the_merged_model_answers_as_the_adapter_on_its_base",),
    ),
    Mutation(
        name="eval_takes_runs_only",
        item="45.3: grpo eval takes any model dir",
        path="grpo/eval_cli.py",
        old="        if is_model(args.path):\n",
        new="        if False:\n",
        tests=(MERGE + "test_any_model_dir_is_evaluated_and_left_as_it_was",),
    ),
    Mutation(
        name="base_model_without_a_template_taken",
        item="45.3: a model without a chat template is refused before it loads",
        path="grpo/preflight.py",
        old="    if not has_chat_template(found):\n",
        new="    if False:\n",
        tests=(TESTS + "test_a_model_without_a_chat_template_is_refused",),
    ),
    Mutation(
        name="bars_drawn_into_log_files",
        item="45.5: progress bars do not run into log lines",
        path="grpo/runtime/progress.py",
        old='{"disable": None}',
        new='{"disable": False}',
        tests=("tests/test_evaluation.py::test_in_a_log_file_each_step_is_a_line_not_a_bar",),
    ),
    Mutation(
        name="wandb_resume_starts_a_new_run",
        item="45.5: a resumed run goes on in the same W&B run",
        path="grpo/observe/run_log.py",
        old="if resumed_step and id_file.is_file()",
        new="if False",
        tests=("tests/test_evaluation.py::test_wandb_offline_run_records_the_scalars",),
    ),
    Mutation(
        name="config_paths_left_relative",
        item="45.4: the config's paths are the user's where the user has them",
        path="grpo/config/loading.py",
        old="    resolve_user_paths(cfg)\n",
        new="",
        tests=(TESTS + "test_the_config_s_paths_are_the_user_s_where_the_user_has_them",),
    ),
    Mutation(
        name="unreported_eval_rates_shown_as_zero",
        item="45.5: no eval accuracy or format for a reward that reports neither",
        path="grpo/eval/questions.py",
        old="        if any(s is not None for s in said):\n",
        new="        if True:\n",
        tests=(
            "tests/test_evaluation.py::test_an_evaluation_of_a_reward_that_reports_no_parts_has_"
            "no_accuracy_or_format",
        ),
    ),
    Mutation(
        name="eval_answers_never_written",
        item="45.2: each evaluation's answers reach samples.jsonl",
        path="grpo/eval/in_training.py",
        old="        row[SAMPLES_KEY] = eval_rows(shown, version, self.prompts, decode)",
        new="        row = row",
        tests=(REFERENCE,),
    ),
    Mutation(
        name="auto_dtype_bfloat16_anywhere",
        item="59: model.dtype auto takes bfloat16 on a CPU that only emulates it (45x a matmul)",
        path="grpo/core/precision.py",
        old='    return "bfloat16" if flags & BF16_CPU_FLAGS else "float32"\n',
        new='    return "bfloat16"\n',
        tests=("tests/test_config.py::test_auto_dtype_is_bfloat16_only_where_the_cpu_computes_it",),
    ),
    Mutation(
        name="rank_input_error_restarted",
        item="64.1: a rank's config or input error reaches launch.sh as torchrun's 1 (restarted)",
        path="grpo/trainer/launch.py",
        old="    if 2 in codes.values():\n",
        new="    if 2 in list(codes.values())[:0]:\n",
        tests=(LAUNCH + "test_a_rank_s_input_error_stays_exit_2_and_is_said_once",),
    ),
    Mutation(
        name="every_rank_says_its_input_error",
        item="64.1: the same input error said once per rank",
        path="grpo/trainer/launch.py",
        old="        told = {failures[r].message for r, c in codes.items() if c == 2}\n",
        new="        told = [failures[r].message for r, c in codes.items() if c == 2]\n",
        tests=(LAUNCH + "test_a_rank_s_input_error_stays_exit_2_and_is_said_once",),
    ),
    Mutation(
        name="starting_trainer_says_interrupted",
        item="64.1: a rank torchrun stopped while it started adds a line to the one saying why",
        path="grpo/trainer/process.py",
        old="logging.DEBUG if starting else logging.ERROR",
        new="logging.ERROR",
        tests=(LAUNCH + "test_a_trainer_stopped_while_it_starts_leaves_the_why_to_who_stopped_it",),
    ),
    Mutation(
        name="failing_reward_judged_only_after_32",
        item="64.3: a reward failing on every answer of the first batch is not stopped",
        path="grpo/tasks/failures.py",
        old="        every_one = len(results) > 1 and failed == seen",
        new="        every_one = False",
        tests=(
            "tests/test_user_rewards.py::test_a_reward_failing_on_most_answers_stops_the_"
            "sampler_naming_it_and_its_first_error",
        ),  # fmt: skip
    ),
    Mutation(
        name="summary_counts_no_timeouts",
        item="64.3: the closing summary's reward timeouts",
        path="grpo/trainer/outputs.py",
        old='for k in ("reward_errors", "reward_timeouts")',
        new='for k in ("reward_errors", "reward_errors")',
        tests=(
            "tests/test_reward_runner.py::test_the_closing_summary_counts_the_reward_s_failures",
        ),
    ),
    Mutation(
        name="peer_keys_unsaid",
        item="64.5: TRL's and verl's keys get a close match, not this project's key",
        path="grpo/config/loading.py",
        old='if (peer := peer_key(f"{prefix}{key}", value)) is not None:',
        new="if (peer := None) is not None:",
        tests=("tests/test_config.py::test_a_peer_s_key_is_named_with_this_project_s",),
    ),
    Mutation(
        name="peer_sections_unsearched",
        item="64.5: a verl section (actor_rollout_ref: {rollout: {n: 8}}) is not looked into",
        path="grpo/config/peer_names.py",
        old="    if isinstance(value, Mapping):\n",
        new="    if False:\n",
        tests=("tests/test_config.py::test_a_peer_s_key_is_named_with_this_project_s",),
    ),
    Mutation(
        name="peer_algorithms_unsaid",
        item="64.5: algo.loss=dapo suggests sapo",
        path="grpo/plan.py",
        old="        said = peer_algorithm(key, value) if isinstance(value, str) else None\n",
        new="        said = None\n",
        tests=("tests/test_config.py::test_a_peer_s_algorithm_is_named_with_what_it_is_here",),
    ),
    Mutation(
        name="summary_paths_relative",
        item="64.6: the closing summary's paths are relative to the repository",
        path="grpo/trainer/outputs.py",
        old="    run_dir = run_dir.resolve()\n",
        new="",
        tests=(SUMMARY,),
    ),
    Mutation(
        name="lora_summary_says_final_model",
        item="64.6: a LoRA run's summary calls its adapter the final model, no merge-lora line",
        path="grpo/trainer/outputs.py",
        old='    if (final / "adapter_config.json").is_file():',
        new="    if False:",
        tests=(SUMMARY,),
    ),
    Mutation(
        name="flat_groups_unreported",
        item="64.7: flat groups are reported only under dynamic sampling",
        path="grpo/trainer/outputs.py",
        old='        "flat_groups_frac": flat_group_share(c.reward, batch.group_size),\n',
        new="",
        tests=(
            "tests/test_reward_runner.py::test_batch_maker_scores_through_the_runner_and_"
            "timeouts_reach_the_metrics",
        ),  # fmt: skip
    ),
    Mutation(
        name="preflight_takes_a_dir_without_tokenizer",
        item="64.2: a model dir without tokenizer files passes grpo check",
        path="grpo/preflight.py",
        old="    if not any((found / name).is_file() for name in TOKENIZER_FILES):\n",
        new="    if False:\n",
        tests=(OPENED,),
    ),
    Mutation(
        name="preflight_leaves_test_rows_unread",
        item="64.2: data.test rows the task cannot read pass grpo check",
        path="grpo/preflight.py",
        old="        if cfg.eval.interval > 0 and not cfg.data.mixture:",
        new="        if False:",
        tests=(OPENED,),
    ),
    Mutation(
        name="preflight_output_dir_unchecked",
        item="64.2: an unwritable output_dir passes grpo check",
        path="grpo/preflight.py",
        old='            _writable("output_dir", cfg.run_dir)\n',
        new="            pass\n",
        tests=(OPENED,),
    ),
    Mutation(
        name="preflight_lora_targets_unchecked",
        item="64.2: a mistyped LoRA target module passes grpo check (the rest train silently)",
        path="grpo/preflight.py",
        old="    if missing := [t for t in targets if t not in parts and t not in names]:\n",
        new="    if missing := []:\n",
        tests=(OPENED,),
    ),
    Mutation(
        name="help_fails_outside_the_checkout",
        item="63.1: `grpo --help` from another directory (only a cwd='/' test runs it so)",
        path="grpo/__main__.py",
        old="        print(__doc__)\n        return 0\n",
        new="        print(__doc__)\n        return int(os.getcwd() == '/')\n",
        tests=(HELP,),
    ),
    Mutation(
        name="check_help_read_as_a_config",
        item='64.5: `grpo check --help` answers "config file not found: --help" again',
        path="grpo/plan.py",
        old='    if not argv or argv[0] in ("-h", "--help"):\n        print(CHECK_USAGE',
        new="    if not argv:\n        print(CHECK_USAGE",
        tests=(COMMAND + "test_every_tool_s_help_exits_0_with_its_usage",),
    ),
    Mutation(
        name="mistyped_tool_without_its_nearest",
        item="64.5: `grpo chek` gets the usage line, not `did you mean check?`",
        path="grpo/__main__.py",
        old="    close = difflib.get_close_matches(name, tools, n=1)\n",
        new="    close = []\n",
        tests=(COMMAND + "test_a_mistyped_tool_gets_the_nearest_one",),
    ),
    Mutation(
        name="version_files_keep_their_writer_s_mode",
        item="64.6: a published version's weights are 0600, whatever the user's umask",
        path="grpo/weights/dirs.py",
        old="    save(tmp)\n    as_umask_allows(tmp)\n",
        new="    save(tmp)\n",
        tests=("tests/test_delivery.py::test_a_version_s_files_take_the_user_s_umask",),
    ),
    Mutation(
        name="merged_model_private",
        item="64.6: merge-lora's model is written readable by its owner alone",
        path="grpo/models/merge.py",
        old="        as_umask_allows(tmp)\n",
        new="",
        tests=(
            "tests/test_merge_lora.py::test_the_merged_model_answers_as_the_adapter_on_its_base",
        ),
    ),
    Mutation(
        name="adapter_names_its_load_path",
        item="64.6: a LoRA version names this machine's cache snapshot as its base again",
        path="grpo/weights/publisher.py",
        old="                if cfg.model.lora.enabled:\n                    name_base(",
        new="                if False:\n                    name_base(",
        tests=(BASE_NAMED + "someone/tiny-model]",),
    ),
    Mutation(
        name="adapter_base_always_a_path",
        item="64.6: an adapter's base given as a hub id is named by a path that does not exist",
        path="grpo/models/embedded.py",
        old="        return str(p.resolve())\n    return path\n",
        new="        return str(p.resolve())\n    return str(p.resolve())\n",
        tests=(BASE_NAMED + "someone/tiny-model]",),
    ),
    Mutation(
        name="delivery_counters_under_train",
        item="64.7: TensorBoard files the trainer's delivery counters under train/ again",
        path="grpo/observe/run_log.py",
        old='    if key in DELIVERY:\n        return "delivery"\n',
        new="",
        tests=(GROUPS,),
    ),
    Mutation(
        name="rates_filed_as_seconds",
        item="64.7: a rate (tokens_per_s) is filed under time/ with the stage timings",
        path="grpo/observe/run_log.py",
        old='if key.endswith("_s") and not key.endswith("_per_s"):',
        new='if key.endswith("_s"):',
        tests=(GROUPS,),
    ),
    Mutation(
        name="eval_shows_no_answers",
        item="64.7: `grpo eval --show N` prints no answer",
        path="grpo/eval_cli.py",
        old="            if show > 0:\n",
        new="            if False:\n",
        tests=("tests/test_integration.py::test_three_steps_two_ranks_with_reloads",),
    ),
    Mutation(
        name="clean_ignores_keep",
        item="64.6: grpo clean --keep N removes the newest rotated runs too",
        path="grpo/clean.py",
        old="    for path in moved_aside(run_dir)[args.keep :]:\n",
        new="    for path in moved_aside(run_dir):\n",
        tests=(CLEAN,),
    ),
    Mutation(
        name="clean_takes_any_numbered_dir",
        item="64.6: grpo clean removes a <name>.<n> that is no run dir, or a link's target",
        path="grpo/clean.py",
        old="        if path.is_symlink() or not (path / RUN_MARKER).is_file():\n",
        new="        if False:\n",
        tests=(CLEAN,),
    ),
    Mutation(
        name="merge_help_cut_off",
        item="64.9: `merge-lora --help` describes itself with a sentence cut off",
        path="grpo/models/merge.py",
        old='    what = __doc__.split("\\n\\n")[0]',
        new='    what = __doc__.split("\\n")[0]',
        tests=(COMMAND + "test_every_tool_s_help_exits_0_with_its_usage[merge-lora]",),
    ),
    Mutation(
        name="launch_sh_takes_any_bash",
        item="64.9: launch.sh starts under a bash its supervisor's `wait -n -p` fails in",
        path="launch.sh",
        old="if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501 )); then\n",
        new="if false; then\n",
        tests=(BASH,),
    ),
    Mutation(
        name="docs_ask_for_bash_4",
        item="64.9: docs/running.md asks for bash 4 again, which launch.sh cannot run on",
        path="docs/running.md",
        old="bash 5.1 or newer",
        new="bash 4.0 or newer",
        tests=(BASH,),
    ),
    Mutation(
        name="step_line_without_eta",
        item="64.4: the step line says no time left (a piped log had none)",
        path="grpo/observe/step_line.py",
        old='    parts.append(f"ETA {clock(eta_s)}" if eta_s is not None else "ETA -")\n',
        new="",
        tests=(
            STEP_LINE + "test_a_step_line_says_step_seconds_eta_and_the_numbers_a_person_watches",
        ),
    ),
    Mutation(
        name="first_step_in_the_eta",
        item="64.4: the first step after a start, with the start in it, sets the ETA",
        path="grpo/observe/step_line.py",
        old="            self.ticked = True\n            return None, None\n",
        new="            self.ticked = True\n",
        tests=(STEP_LINE + "test_the_clock_leaves_the_first_step_of_a_process_out_of_its_mean",),
    ),
    Mutation(
        name="step_line_unaligned",
        item="64.4: the step numbers are not padded: a run's lines do not align",
        path="grpo/observe/step_line.py",
        old="    parts = [f\"step {row['step']:>{width}}/{total}\"]\n",
        new="    parts = [f\"step {row['step']}/{total}\"]\n",
        tests=(STEP_LINE + "test_lines_of_one_run_are_aligned",),
    ),
    Mutation(
        name="trainer_start_silent",
        item="64.4: the trainer says nothing while it loads the policy into DeepSpeed",
        path="grpo/trainer/engines.py",
        old='    log.info("trainer: loading the policy from %s into DeepSpeed',
        new='    log.debug("trainer: loading the policy from %s into DeepSpeed',
        tests=("tests/test_integration.py::test_three_steps_two_ranks_with_reloads",),
    ),
    Mutation(
        name="check_opens_the_user_s_run_dir",
        item="64.2/9: grpo check from the user's dir opens the run dir launch.sh writes",
        path="grpo/plan.py",
        old="        cfg.output_dir = str(REPO_ROOT / cfg.output_dir)\n",
        new="",
        tests=(
            "tests/test_grpo_command.py::"
            "test_grpo_check_from_the_user_s_dir_opens_the_run_dir_launch_sh_writes",
        ),
    ),
    Mutation(
        name="preflight_lora_targets_unchecked_on_embedded",
        item="64.2: `[q_prj, v_proj]` on the demo's config (model.path embedded) says config ok",
        path="grpo/preflight.py",
        old="        lora_dir = model_dir or (BASE_DIR if is_converted() else None)\n",
        new="        lora_dir = model_dir\n",
        tests=(TESTS + "test_lora_targets_are_checked_against_the_embedded_model_too",),
    ),
    Mutation(
        name="reward_failure_healed_by_restarts",
        item="64.3: a reward failing past its bound is a crash launch.sh restarts three times",
        path="grpo/cli.py",
        old='        log.error("%s", e)\n        return 2\n    except (ValueError,',
        new="        raise\n    except (ValueError,",
        tests=(
            "tests/test_user_rewards.py::"
            "test_a_sampler_stopped_by_a_failing_reward_exits_2_and_is_not_restarted",
        ),
    ),
    Mutation(
        name="yaml_error_in_five_lines",
        item="64.1: a YAML syntax error is PyYAML's five lines, not one saying where",
        path="grpo/config/loading.py",
        old='raise ConfigError(f"{p} is not valid YAML: {yaml_problem(e)}")',
        new='raise ConfigError(f"{p} is not valid YAML: {e}")',
        tests=("tests/test_config.py::test_missing_and_bad_files",),
    ),
    Mutation(
        name="launch_help_without_usage",
        item="64.5: `grpo launch --help` has no usage line where every other tool's has one",
        path="launch.sh",
        old='  echo "usage: bash launch.sh CONFIG.yaml [section.key=value ...] [--resume]',
        new='  echo "bash launch.sh CONFIG.yaml [section.key=value ...] [--resume]',
        tests=("tests/test_grpo_command.py::test_grpo_launch_says_its_usage_as_every_tool_does",),
    ),
    Mutation(
        name="input_error_in_a_backoff_waited_out",
        item="64.1/3: a role's exit 2 during another's restart backoff restarts that one first",
        path="launch.sh",
        old="        if ((woke_code == 2)); then\n",
        new="        if false; then\n",
        tests=(
            "tests/test_launch_path.py::"
            "test_an_input_error_during_a_restart_s_backoff_stops_the_run_unrestarted",
        ),
    ),
    Mutation(
        name="trainer_restarted_after_its_samplers_input_stopped_them",
        item="64.3: samplers stopped by their reward end the trainer with 1, which launch.sh heals",
        path="grpo/trainer/process.py",
        old="    return 2 if messages.INPUT_STOPPED in str(error) else 1\n",
        new="    return 1\n",
        tests=(
            "tests/test_user_rewards.py::"
            "test_samplers_stopped_by_their_reward_end_the_trainer_with_exit_2_too",
        ),
    ),
    Mutation(
        name="sampler_stop_hides_its_input_error",
        item="64.3: a sampler stopped by its reward tells the trainer it crashed",
        path="grpo/sampler/loop.py",
        old='        return f"{messages.INPUT_STOPPED}: {error}"\n',
        new='        return f"crashed: {error}"\n',
        tests=(
            "tests/test_user_rewards.py::"
            "test_a_sampler_stopped_by_a_failing_reward_tells_the_trainer_so",
        ),
    ),
)
