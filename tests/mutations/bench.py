"""Mutations of the benchmarks and their committed results (issue 33, items 2, 5 and 11).

Item 2: the tokens the padding benchmark's packed forward computes are counted from what the
trainer's code path feeds the model, so a packer that packs nothing turns the quick padding run
red (the formula it replaced gave 1.0 whatever the code did). Item 5: the e2e row is one busy
share, generation + training over the wall clock, at most 1. Item 11: `met` follows from the
numbers and the target, every committed row is a full-size run whose ratio and `met` recompute,
and the docs table is the one generated from those rows.
"""

from __future__ import annotations

from tests.mutations import Mutation

TESTS = "tests/test_bench.py"
PADDING_QUICK = f"{TESTS}::test_benchmark_runs_quick[padding]"
E2E_QUICK = f"{TESTS}::test_benchmark_runs_quick[e2e]"
COMMITTED = f"{TESTS}::test_committed_result_is_consistent_and_full_size"

MUTATIONS = (
    Mutation(
        name="packer_packs_nothing",
        item="2: packed tokens are counted from the packed forward, not from a formula",
        path="grpo/scoring/forward.py",
        old="    if packed:\n        pairs = pack_pairs(prompts, completions)",
        new="    if False:\n        pairs = pack_pairs(prompts, completions)",
        tests=(PADDING_QUICK,),
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
        name="e2e_busy_share_inverted",
        item="5: the e2e row is a share of the wall clock, at most 1",
        path="bench/e2e.py",
        old='"ours/baseline", BUSY_TARGET',
        new='"baseline/ours", BUSY_TARGET',
        tests=(E2E_QUICK,),
    ),
    Mutation(
        name="met_without_target",
        item="11: met is the ratio against the row's target",
        path="bench/common.py",
        old="else ratio >= self.target",
        new="else ratio >= 1.0",
        tests=(f"{TESTS}::test_result_computes_ratio_and_met_from_its_numbers",),
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
        old="| 84.8 CPU s | 0.855 | baseline / ours | ratio ≥ 1.00 | no |",
        new="| 84.8 CPU s | 0.855 | baseline / ours | ratio ≥ 1.00 | yes |",
        tests=(f"{TESTS}::test_docs_table_is_generated_from_the_committed_results",),
    ),
)
