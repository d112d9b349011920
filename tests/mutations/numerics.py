"""Mutations of the numerics the tolerance-checked tests guard (issue 33, items 8, 9 and 14).

Item 8: DeepSpeed's bf16 engine left without its inf/NaN scan applies a non-finite step, and a
skipped step's norm reported as a number, turn the skipped-step test red. Item 9: a bf16
log-prob gradient 1% off, or missing the label's own softmax term, or its temperature, turns the
bf16 gradient test red (the old absolute 1e-2 passed the first two). Item 14: a ZeRO-3 gradient
1% off (the first step's norm), or a micro-batch dropped under ZeRO-3 (the norm, or from the
second step on, the weights), turns the ZeRO-3 comparison red.
"""

from __future__ import annotations

from tests.mutations import Mutation

SKIP_TEST = "tests/test_skipped_steps.py::test_a_non_finite_gradient_skips_the_step_and_is_counted"
BF16_TEST = "tests/test_logprobs.py::test_token_logprobs_non_contiguous_and_bf16"
ZERO3_TEST = "tests/test_zero3.py::test_zero3_and_offload_on_two_ranks"

MUTATIONS = (
    Mutation(
        name="bf16_overflow_check_off",
        item="8: a bf16 step with non-finite gradients is skipped by DeepSpeed's bf16 check",
        path="grpo/trainer/engines.py",
        old='ds["bf16"] = {"enabled": cfg.model.dtype == "bfloat16"}',
        new='ds["bf16"] = {"enabled": cfg.model.dtype == "bfloat16", "check_grad_overflow": False}',
        tests=(SKIP_TEST,),
    ),
    Mutation(
        name="skipped_step_norm_reported",
        item="8: a skipped step's gradient norm is left out, not reported as inf",
        path="grpo/trainer/step.py",
        old="if grad_norm is not None and math.isfinite(float(grad_norm)):",
        new="if grad_norm is not None:",
        tests=(SKIP_TEST,),
    ),
    Mutation(
        name="logprob_gradient_1pct_off",
        item="9: the bf16 gradient is compared entry by entry, not to an absolute 1e-2",
        path="grpo/scoring/kernels.py",
        old="grad_logits[:, sl] = grad.to(grad_logits.dtype)",
        new="grad_logits[:, sl] = grad.mul_(1.01).to(grad_logits.dtype)",
        tests=(BF16_TEST,),
    ),
    Mutation(
        name="logprob_gradient_without_the_labels_softmax_term",
        item="9: the bf16 gradient keeps the label's own -g p term",
        path="grpo/scoring/kernels.py",
        old="grad.scatter_add_(-1, labels[:, sl, None], g)  # + g * onehot(label)",
        new="grad.scatter_(-1, labels[:, sl, None], g)  # + g * onehot(label)",
        tests=(BF16_TEST,),
    ),
    Mutation(
        name="logprob_gradient_without_temperature",
        item="9: the bf16 gradient is checked at a temperature too",
        path="grpo/scoring/kernels.py",
        old="g = grad_out[:, sl, None].float() / t  # (B, c, 1)",
        new="g = grad_out[:, sl, None].float()  # (B, c, 1)",
        tests=(BF16_TEST,),
    ),
    Mutation(
        name="zero3_gradient_1pct_off",
        item="14: ZeRO-3's first-step gradient norm matches ZeRO-2's",
        path="grpo/trainer/step.py",
        old="accumulate_backward(engine, loss * share, last=i == len(parts) - 1)",
        new="accumulate_backward(engine, loss * share * (1.01 if engine.zero_optimization_stage()"
        " == 3 else 1.0), last=i == len(parts) - 1)",
        tests=(ZERO3_TEST,),
    ),
    Mutation(
        name="zero3_drops_a_micro_batch",
        item="14: ZeRO-3 with offload trains to ZeRO-2's weights",
        path="grpo/trainer/step.py",
        old="accumulate_backward(engine, loss * share, last=i == len(parts) - 1)",
        new="accumulate_backward(engine, loss * share * (0.0 if engine.zero_optimization_stage()"
        " == 3 and i == 0 and len(parts) > 1 else 1.0), last=i == len(parts) - 1)",
        tests=(ZERO3_TEST,),
    ),
    Mutation(
        # from the second step on only: the first-step checks pass, the weights' must fail
        name="zero3_drops_a_micro_batch_after_the_first_step",
        item="14: ZeRO-3 with offload trains to ZeRO-2's weights (the weights' own check)",
        path="grpo/trainer/step.py",
        old="accumulate_backward(engine, loss * share, last=i == len(parts) - 1)",
        new="accumulate_backward(engine, loss * share * (0.0 if engine.zero_optimization_stage()"
        " == 3 and i == 0 and len(parts) > 1 and engine.global_steps > 0 else 1.0),"
        " last=i == len(parts) - 1)",
        tests=(ZERO3_TEST,),
    ),
)
