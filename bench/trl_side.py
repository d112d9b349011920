"""TRL's `GRPOTrainer` on one workload: the baseline side of bench/e2e_vs_trl.py, run in a
process of its own (as a TRL user runs it) so that its memory is measured alone.

    python -m bench.trl_side CONFIG OUT_DIR WORKLOAD_JSON [override ...]

It asks the questions the project's sampler would ask under CONFIG and the overrides, in the same
order (the sampler's own `Shard`), with the same system prompt and instructions, scores the
answers with the same reward function (`RecordingReward`: TRL's reward signature around the
task's), and trains with the workload's settings. Each optimizer step writes a row to
OUT_DIR/steps.jsonl: the time, the dataset rows asked, and each answer's prompt and completion
length and reward. OUT_DIR/model holds the final weights.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.workload import Workload, trl_arguments


class RecordingReward:
    """The task's reward in TRL's signature (prompts, completions, completion_ids, **columns);
    it also records what each generation asked and got, which is how the benchmark knows the
    work TRL did rather than the work it was told to do."""

    def __init__(self, reward_fn: Any, rows: list[dict], prompt_tokens: list[int]):
        self.reward_fn = reward_fn
        self.rows = rows  # dataset position -> the task's row
        self.prompt_tokens = prompt_tokens  # dataset position -> its prompt's token count
        self.__name__ = "task_reward"  # TRL names the reward's metrics after it
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, position, **_: Any) -> list[float]:
        from grpo.tasks.base import score

        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rows = [self.rows[p] for p in position]
        rewards = [score(self.reward_fn, t, row)[0] for t, row in zip(texts, rows, strict=True)]
        self.calls.append({
            "positions": list(position),
            "prompt_lens": [self.prompt_tokens[p] for p in position],
            "completion_lens": [len(ids) for ids in completion_ids],
            "rewards": rewards,
            "answers": texts,
        })  # fmt: skip
        return rewards


def main(argv: list[str]) -> int:
    config, out_dir, workload_json, *overrides = argv
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo.config import load_config
    from grpo.models.loading import load_tokenizer, resolve_model_path
    from grpo.sampler.data import Shard
    from grpo.tasks import phrasing, run_reward, task_for

    workload = Workload(**json.loads(workload_json))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(Path(config), overrides)
    task = task_for(cfg)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    # The sampler's questions, in its order: one step's questions after another.
    drawn = Shard(cfg, task, tokenizer).draw(workload.questions * workload.steps)
    asked = phrasing.varied(task, cfg.data.instructions)
    dataset = datasets.Dataset.from_list([
        {"prompt": asked.build_messages(p.row, cfg.data.system_prompt), "position": k,
         "index": p.index}
        for k, p in enumerate(drawn)
    ])  # fmt: skip
    reward = RecordingReward(run_reward(task, cfg.data.reward), [p.row for p in drawn],
                             [len(p.ids) for p in drawn])  # fmt: skip
    steps_file = (out / "steps.jsonl").open("w")

    class StepRows(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            call = reward.calls[-1]
            row = {"step": state.global_step, "time": time.time(), "generations": len(reward.calls),
                   "indices": [drawn[p].index for p in call["positions"]], **call}  # fmt: skip
            steps_file.write(json.dumps(row) + "\n")
            steps_file.flush()

    torch.manual_seed(cfg.rollout.seed)
    trainer = GRPOTrainer(
        model=str(model_path),
        reward_funcs=reward,
        args=trl_arguments(workload, out / "trainer", cfg.rollout.seed),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepRows()],
    )
    trainer.train()
    steps_file.close()
    trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(out / "model")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
