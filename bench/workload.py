"""One workload, told to both sides of bench/e2e_vs_trl.py: the project's config overrides and
TRL's `GRPOConfig` are both made from it here, and `same_work` checks afterwards, from what each
side recorded, that both generated and trained what the workload says, no less."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpo.core.precision import native_dtype


@dataclass(frozen=True)
class Workload:
    questions: int  # per step
    group: int  # answers per question
    new_tokens: int  # each answer's length with fixed_length, its cap without
    steps: int  # optimizer steps, one per batch of questions x group answers
    fixed_length: bool = True  # EOS ignored: every answer exactly new_tokens long
    temperature: float = 0.8
    lr: float = 4e-5  # constant, no warm-up
    micro_batch: int = 8  # answers per forward/backward
    max_grad_norm: float = 1.0
    # TRL's precision: "bf16" (float32 weights under bfloat16 autocast: 53-56 s a demo-sized
    # step on an AVX-512 BF16 CPU, against 71-77 in "fp32"), "fp32", or "auto": bf16 where the
    # node computes it natively, as the demo's model.dtype auto decides (grpo.core.precision).
    trl_precision: str = "auto"
    # TRL's generation: "hf" (generate) or "vllm" (use_vllm, colocate: the engine in TRL's process)
    trl_engine: str = "hf"

    @property
    def answers(self) -> int:
        return self.questions * self.group

    def text(self) -> str:
        length = "exactly" if self.fixed_length else "at most"
        return (f"{self.questions} questions x {self.group} answers a step, {length} "
                f"{self.new_tokens} tokens each, {self.steps} steps")  # fmt: skip

    def json(self) -> dict[str, Any]:
        return asdict(self)


def ours_overrides(w: Workload) -> list[str]:
    """The project's config overrides for `w` (on top of configs/cpu_demo.yaml): KL off, one
    optimizer step per batch, on-policy, no evaluation."""
    return [
        f"rollout.questions_per_step={w.questions}",
        f"rollout.group_size={w.group}",
        f"rollout.max_new_tokens={w.new_tokens}",
        f"rollout.ignore_eos={str(w.fixed_length).lower()}",
        f"rollout.temperature={w.temperature}",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        f"train.total_steps={w.steps}",
        f"train.lr={w.lr}",
        "train.lr_schedule=constant",
        "train.lr_warmup_steps=0",
        f"train.micro_batch_size={w.micro_batch}",
        f"train.max_grad_norm={w.max_grad_norm}",
        "algo.kl_loss_coef=0.0",
        "eval.interval=0",
    ]


def trl_arguments(w: Workload, output_dir: Path, seed: int):
    """TRL's GRPOConfig for `w`: the same sampling, length, lr, clipping and KL (none); one
    generation of questions x group answers per optimizer step, in micro-batches of
    w.micro_batch (gradient accumulation over the rest); the dataset in the order given."""
    import torch
    from trl import GRPOConfig

    if w.answers % w.micro_batch:
        raise ValueError(f"{w.answers} answers a step do not split into micro-batches of "
                         f"{w.micro_batch}")  # fmt: skip
    accumulation = w.answers // w.micro_batch
    precision = w.trl_precision
    if precision == "auto":
        precision = "bf16" if native_dtype() == "bfloat16" else "fp32"
    bf16, vllm = precision == "bf16", w.trl_engine == "vllm"
    fixed = {"min_tokens": w.new_tokens} if vllm else {"min_new_tokens": w.new_tokens}
    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=not torch.cuda.is_available(),
        bf16=bf16,
        model_init_kwargs={"dtype": torch.float32},
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,  # one generation per optimizer step
        num_generations=w.group,
        max_completion_length=w.new_tokens,
        use_vllm=vllm,
        vllm_mode="colocate",
        # EOS suppressed until the full length (HF generate's and vLLM's words for it)
        generation_kwargs=fixed if w.fixed_length else None,
        temperature=w.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=w.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=w.max_grad_norm,
        beta=0.0,  # no KL term, no reference model
        loss_type="grpo",  # each answer's token mean, then the mean over answers: as ours
        max_steps=w.steps,
        shuffle_dataset=False,  # the questions in the order given: the project's sampler's
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )


class DifferentWork(AssertionError):
    """The two sides did not generate or train the same tokens."""


def step_work(questions: list[int], prompt_lens: list[int], completion_lens: list[int]) -> tuple:
    """One step's work, order-free: the questions asked and the (prompt, completion) lengths."""
    lengths = Counter(zip(prompt_lens, completion_lens, strict=True))
    return tuple(sorted(set(questions))), tuple(sorted(lengths.items()))


def same_work(w: Workload, ours: list[tuple], trl: list[tuple]) -> None:
    """DifferentWork unless both sides ran w.steps steps of w.questions distinct questions with
    w.answers answers (each exactly w.new_tokens long with fixed_length), the same questions
    and lengths step by step. Each side's steps are `step_work` tuples."""
    for side, steps in (("ours", ours), ("TRL", trl)):
        if len(steps) != w.steps:
            raise DifferentWork(f"{side} ran {len(steps)} steps, the workload {w.steps}")
        for k, (questions, lengths) in enumerate(steps, 1):
            answers = sum(n for _, n in lengths)
            if len(set(questions)) != w.questions or answers != w.answers:
                raise DifferentWork(f"{side} step {k}: {len(set(questions))} questions and "
                                    f"{answers} answers, the workload {w.questions} and "
                                    f"{w.answers}")  # fmt: skip
            long = {c for (_, c), _ in lengths}
            if w.fixed_length and long != {w.new_tokens}:
                raise DifferentWork(f"{side} step {k}: answers of {sorted(long)} tokens, the "
                                    f"workload exactly {w.new_tokens}")  # fmt: skip
    if [q for q, _ in ours] != [q for q, _ in trl]:
        raise DifferentWork("the two sides asked different questions")
    if w.fixed_length and ours != trl:
        raise DifferentWork("the two sides' prompts of the same questions differ in length")
