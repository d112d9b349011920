"""Mutations of the benchmarks and their committed results (issue 33, items 2, 5 and 11).

Item 2: the tokens the padding benchmark's packed forward computes are counted from what the
trainer's code path feeds the model, so a packer that packs nothing turns the quick padding run
red (the formula it replaced gave 1.0 whatever the code did). Item 5: the e2e busy share,
generation + training over the wall clock, at most 1 (a test now, no longer a row). Item 11:
`met` follows from the numbers and the target, every committed row is a full-size run whose
ratio and `met` recompute, and the docs table is the one generated from those rows. Issue 41,
item 3: `met` needs the target beyond the spread of the repetitions, and 3 of them; what the
code guarantees (a delta never bigger than the full copy, the trainer sending a version about
once to any number of relaying receivers) is a test, not a row.
"""

from __future__ import annotations

from tests.mutations import Mutation

TESTS = "tests/test_bench.py"
PADDING_QUICK = f"{TESTS}::test_benchmark_runs_quick[padding]"
COMMITTED = f"{TESTS}::test_committed_result_is_consistent_and_full_size"
SPREAD = f"{TESTS}::test_met_needs_the_target_beyond_the_spread"
GUARANTEES = "tests/test_bench_guarantees.py"

MUTATIONS = (
    Mutation(
        name="packer_packs_nothing",
        item="2: packed tokens are counted from the packed forward, not from a formula",
        path="grpo/scoring/forward.py",
        old="    if packed:\n        pairs = pack_pairs(prompts, completions)",
        new="    if False:\n        pairs = pack_pairs(prompts, completions)",
        tests=(
            "tests/test_logprobs.py::test_the_packed_forward_feeds_the_model_one_row_of_the_real_tokens",
            PADDING_QUICK,
        ),
    ),
    Mutation(
        name="e2e_busy_share_without_training",
        item="5: the e2e busy share counts generation and training",
        path="bench/e2e.py",
        old='busy = sum(r["sampler_gen_s"] + r["train_s"] for r in timed)',
        new='busy = sum(r["sampler_gen_s"] for r in timed)',
        tests=(f"{TESTS}::test_e2e_busy_share_counts_generation_and_training",),
    ),
    Mutation(
        name="met_without_target",
        item="11: met is the ratio against the row's target",
        path="bench/common.py",
        old="else worst >= self.target",
        new="else worst >= 1.0",
        tests=(f"{TESTS}::test_result_computes_ratio_and_met_from_its_numbers",),
    ),
    Mutation(
        name="met_from_the_medians_only",
        item="41.3: met needs the target reached by the worst case of the spread",
        path="bench/common.py",
        old="worst = worst_case(self.direction, self.baseline_spread, self.ours_spread)",
        new='worst = self.ours if self.direction == "ours<=target" else ratio',
        tests=(SPREAD,),
    ),
    Mutation(
        name="met_with_too_few_repeats",
        item="41.3: a row measured fewer than 3 times cannot be met",
        path="bench/common.py",
        old="reached and self.repeats >= MIN_REPEATS",
        new="reached",
        tests=(SPREAD,),
    ),
    Mutation(
        name="codec_may_send_more_than_full",
        item="41.3: a delta is never bigger than the full copy (a test, not a row)",
        path="grpo/weights/stream/deltas.py",
        old="sizes = {FULL: new.nbytes, SPARSE:",
        new="sizes = {SPARSE:",
        tests=(f"{GUARANTEES}::test_a_delta_is_never_bigger_than_the_full_copy_and_decodes_back",),
    ),
    Mutation(
        name="fanout_every_receiver_from_the_trainer",
        item="41.3: the trainer sends a version about once whatever N (a test, not a row)",
        path="bench/weight_fanout.py",
        old="return {me: [*upstream(me, relays, FANOUT), trainer] for me in ids}",
        new="return {me: [trainer] for me in ids}",
        tests=(
            f"{GUARANTEES}::test_the_trainer_sends_each_version_about_once_whatever_the_receivers",
        ),
    ),
    Mutation(
        name="committed_row_claims_met",
        item="11: a committed row's met is recomputed from its numbers and target",
        path="bench/results/padding_step_time_packed.json",
        old='"met": false',
        new='"met": true',
        tests=(f"{COMMITTED}[padding_step_time_packed]",),
    ),
    Mutation(
        name="committed_quick_run",
        item="11: no committed row is from a --quick run",
        path="bench/results/padding_tokens_computed_per_real.json",
        old='"quick": false',
        new='"quick": true',
        tests=(f"{COMMITTED}[padding_tokens_computed_per_real]",),
    ),
    Mutation(
        name="docs_table_edited_by_hand",
        item="11: the docs table is the one generated from bench/results/",
        path="docs/benchmarks.md",
        old="| 0.834 | baseline / ours | 0.817 | ratio ≥ 1.00 | 3 | no |",
        new="| 0.834 | baseline / ours | 0.817 | ratio ≥ 1.00 | 3 | yes |",
        tests=(f"{TESTS}::test_docs_table_is_generated_from_the_committed_results",),
    ),
)

# Issue 59: the comparison with TRL hands both sides one workload: TRL's arguments are built
# from it (a CI-tier test), and what each side recorded is checked against it (bench.workload.
# same_work) in the quick run both sides make (extended tier: 78 s).
TRL_QUICK = (f"{TESTS}::test_benchmark_runs_quick[e2e_vs_trl]",
             "tests/test_bench_vs_trl.py::test_trl_is_configured_with_the_workload")  # fmt: skip
MUTATIONS += (
    Mutation(
        name="trl_given_fewer_answers",
        item="59: TRL samples half the answers per question (a smaller workload)",
        path="bench/workload.py",
        old="        num_generations=w.group,\n",
        new="        num_generations=w.group // 2,\n",
        tests=TRL_QUICK,
    ),
    Mutation(
        name="trl_given_shorter_answers",
        item="59: TRL's answers are cut at half the workload's length",
        path="bench/workload.py",
        old="        max_completion_length=w.new_tokens,\n",
        new="        max_completion_length=w.new_tokens // 2,\n",
        tests=TRL_QUICK,
    ),
    Mutation(
        name="hf_stops_at_eos_under_ignore_eos",
        item="59: rollout.ignore_eos does not reach HF generate: answers end at EOS",
        path="grpo/rollout/hf.py",
        old="            min_new_tokens=max_new_tokens if sampling.ignore_eos else None,\n",
        new="            min_new_tokens=None,\n",
        tests=("tests/test_fixed_length.py::test_hf_answers_run_to_the_cap_past_eos",),
    ),
    Mutation(
        name="vllm_stops_at_eos_under_ignore_eos",
        item="59: rollout.ignore_eos does not reach vLLM: answers end at EOS",
        path="grpo/rollout/vllm.py",
        old="            ignore_eos=sampling.ignore_eos,\n",
        new="            ignore_eos=False,\n",
        tests=("tests/test_vllm.py::test_ignore_eos_answers_run_to_the_cap",),
    ),
)
