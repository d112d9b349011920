"""Mutations of the guards against reward hacking (issue 58): the rewards' worked-answer rules,
the degeneration measures and their alarm, and the evaluation's unseen phrasings. Each puts
back what let the CPU demo farm "#### 2", or hides it, and names the CI-tier tests that must
then fail."""

from __future__ import annotations

from tests.mutations import Mutation

TASKS = "tests/test_tasks.py"
DEGEN = "tests/test_degeneration.py"
PHRASING = "tests/test_phrasing.py"
SPAM = f"{TASKS}::test_answer_spam_earns_nothing_and_says_why"
ALARM = f"{DEGEN}::test_the_alarm_names_the_measure_with_an_example_once_and_again_only_on_change"
RUN_LOG = f"{DEGEN}::test_a_run_log_writes_the_measures_and_each_answers_flags"
VARIANTS = f"{PHRASING}::test_the_evaluation_asks_each_variant_in_its_own_words"

FROM_SAMPLER = "tests/test_eval_from_sampler.py"
MUTATIONS = (
    Mutation(
        name="spam_reward_back",
        item="58.1: any parseable marker earns the format credit again",
        path="grpo/tasks/gsm8k.py",
        old="    formatted = refused is None\n",
        new="    formatted = pred is not None\n",
        tests=(SPAM,),
    ),
    Mutation(
        name="repeated_markers_counted_once",
        item="58.1: an answer holding several markers is a worked one",
        path="grpo/tasks/answer_form.py",
        old="    if markers > 1:\n",
        new="    if markers > 99:\n",
        tests=(SPAM,),
    ),
    Mutation(
        name="no_working_needed",
        item="58.1: a bare '#### N' is paid as a worked answer",
        path="grpo/tasks/answer_form.py",
        old="    if len(_WORD_RE.findall(text[:start])) < MIN_WORKING_WORDS:\n",
        new="    if len(_WORD_RE.findall(text[:start])) < 0:\n",
        tests=(SPAM,),
    ),
    Mutation(
        name="final_number_unchecked",
        item="58.1: a worked answer may end with a number its working never arrived at",
        path="grpo/tasks/gsm8k.py",
        old="    if last is None or pred is None or pred in working_result(text[: last[0]]):\n",
        new="    if True:\n",
        tests=(SPAM,),
    ),
    Mutation(
        name="any_number_of_the_working",
        item="58.1: an operand or an earlier sentence's number counts as the working's result",
        path="grpo/tasks/gsm8k.py",
        old="            results = [numbers[-1], *(m[1] for m in _RESULT_RE.finditer(plain))]\n",
        new="            results = numbers\n",
        tests=(SPAM, f"{TASKS}::test_working_result_is_the_last_numbered_sentence_s_results"),
    ),
    Mutation(
        name="false_equations_counted_true",
        item="58.2: an equation whose sides differ is taken as true",
        path="grpo/tasks/answer_form.py",
        old="agree = abs(value - result) <= max(Fraction(1, 100), abs(result) / 1000)",
        new="agree = True",
        tests=(f"{DEGEN}::test_false_arithmetic_is_measured_among_the_answers_that_state_any",),
    ),
    Mutation(
        name="math_boxes_any_number",
        item="58.1: the MATH reward checks an answer with several boxes",
        path="grpo/tasks/math500.py",
        old="    refused = answer_form.refusal(completion, last, len(boxes))\n",
        new="    refused = answer_form.refusal(completion, last, 1)\n",
        tests=("tests/test_math_task.py::test_math_spam_earns_nothing",),
    ),
    Mutation(
        name="alarm_never_raised",
        item="58.2: a measure past its threshold is never said",
        path="grpo/observe/degeneration.py",
        old="        for name in sorted(now.keys() - before):\n",
        new="        for name in sorted(now.keys() - before - set(THRESHOLDS)):\n",
        tests=(ALARM, RUN_LOG),
    ),
    Mutation(
        name="alarm_every_step",
        item="58.2: the warning is bounded: once, then only on change",
        path="grpo/observe/degeneration.py",
        old="        self.alarmed[kind] = set(now)\n",
        new="        self.alarmed[kind] = set()\n",
        tests=(ALARM,),
    ),
    Mutation(
        name="repetition_unseen",
        item="58.2: an answer that loops is not counted",
        path="grpo/tasks/answer_form.py",
        old="    return repeated_line(text) or repeated_ngram(text)\n",
        new="    return None\n",
        tests=(
            f"{DEGEN}::test_each_answer_is_flagged_for_what_it_repeats_and_how_many_markers_it_holds",
            SPAM,
        ),
    ),
    Mutation(
        name="length_against_itself",
        item="58.2: the length is measured against the run's first steps",
        path="grpo/observe/degeneration.py",
        old='        if row.get("step", 0) <= BASELINE_STEPS:\n',
        new="        if True:\n",
        tests=(f"{DEGEN}::test_length_and_entropy_are_measured_against_the_first_steps",),
    ),
    Mutation(
        name="run_log_measures_nothing",
        item="58.2: the trainer's rows carry the measures of their answers",
        path="grpo/observe/run_log.py",
        old="            self.watch.step(row, texts, c.reward.tolist(), refused)\n",
        new="",
        tests=(RUN_LOG,),
    ),
    Mutation(
        name="variants_asked_with_the_training_prompt",
        item="58.4: a prompt variant is evaluated with the training prompt",
        path="grpo/eval/questions.py",
        old="        asked = phrasing.rephrased(task, variant)\n",
        new="        asked = phrasing.varied(task, cfg.data.instructions)\n",
        tests=(VARIANTS,),
    ),
    Mutation(
        name="variant_of_the_training_prompt_taken",
        item="58.4: a variant that is training's own phrasing passes the check",
        path="grpo/tasks/phrasing.py",
        old="        if same_instruction and same_system:\n",
        new="        if False:\n",
        tests=(
            f"{PHRASING}::test_a_variant_training_uses_or_a_task_cannot_ask_is_refused_before_the_run",
        ),
    ),
    Mutation(
        name="training_asks_one_instruction",
        item="58.3: data.instructions varies the training phrasing",
        path="grpo/tasks/phrasing.py",
        old='        pick = zlib.crc32(messages[-1]["content"].encode()) % len(choices)\n',
        new="        pick = 0\n",
        tests=(
            f"{PHRASING}::test_training_asks_each_question_with_one_instruction_the_same_every_time",
        ),
    ),
    Mutation(
        name="sampler_asks_only_the_run_prompt",
        item="59: eval.engine sampler answers the run's questions without the prompt variants",
        path="grpo/sampler/evaluation.py",
        old="        self.prompts = [p for ps in sets.values() for p in ps]\n",
        new='        self.prompts = sets[""]\n',
        tests=(
            f"{FROM_SAMPLER}::test_the_sampler_asks_the_trainers_questions_in_the_trainers_order",
        ),
    ),
    Mutation(
        name="sampler_answers_again_at_every_wait",
        item="59: eval.engine sampler generates the same version's answers at every wait",
        path="grpo/sampler/evaluation.py",
        old="        if key in self.answered:\n",
        new="        if False:\n",
        tests=(
            f"{FROM_SAMPLER}::test_the_sampler_loads_the_asked_version_answers_once_and_resends_"
            "while_still_asked",
        ),
    ),
    Mutation(
        name="sampler_eval_anywhere",
        item="59: eval.engine sampler (or auto) is taken where the sampler skips versions",
        path="grpo/config/rules.py",
        old="    if e.interval % t.sync_interval:\n",
        new="    if False:\n",
        tests=(
            f"{FROM_SAMPLER}::test_the_sampler_answers_only_where_it_loads_every_version_in_order",
        ),
    ),
    Mutation(
        name="auto_eval_on_the_trainer",
        item="59: eval.engine auto leaves the demo's evaluation on the trainer's HF generate",
        path="grpo/config/rules.py",
        old='        return "trainer" if sampler_cannot_answer(cfg) else "sampler"\n',
        new='        return "trainer"\n',
        tests=(
            f"{FROM_SAMPLER}::test_the_sampler_answers_only_where_it_loads_every_version_in_order",
        ),
    ),
    Mutation(
        name="one_sided_p_value",
        item="58.5: the held-out change's p-value is one-sided (half the two-sided one)",
        path="grpo/eval/significance.py",
        old="    return math.erfc(abs(z) / math.sqrt(2))\n",
        new="    return math.erfc(abs(z) / math.sqrt(2)) / 2\n",
        tests=("tests/test_significance.py::test_the_p_value_is_the_two_sided_pooled_z_tests",),
    ),
    Mutation(
        name="held_out_change_against_the_previous_evaluation",
        item="58.5: the summary compares the last evaluation with the one before, not the first",
        path="grpo/trainer/outputs.py",
        old="    first, last = rows[0], rows[-1]\n",
        new="    first, last = rows[-2], rows[-1]\n",
        tests=(
            "tests/test_significance.py::"
            "test_the_closing_summary_compares_the_first_evaluation_with_the_last",
        ),
    ),
    Mutation(
        name="entropy_called_hacking",
        item="58.2: a falling entropy alone is called reward hacking (it fell on right answers)",
        path="grpo/observe/degeneration.py",
        old='SUGGESTS = {"degen_entropy_ratio": "exploring less?"}\n',
        new="SUGGESTS: dict[str, str] = {}\n",
        tests=(f"{DEGEN}::test_length_and_entropy_are_measured_against_the_first_steps",),
    ),
)
