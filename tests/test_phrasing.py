"""How questions are put (grpo.tasks.phrasing): data.instructions varies the training phrasing,
eval.prompt_variants asks the evaluation's questions under phrasings training never used."""

from __future__ import annotations

import pytest

from grpo.config import ConfigError, load_config
from grpo.config.data import Phrasing, parse_variants
from grpo.tasks import get_task, phrasing
from grpo.tasks.gsm8k import ANSWER_INSTRUCTION

ROW = {"question": "Tom has 3 bags of 4 apples. How many apples?", "answer": "#### 12"}
OTHERS = ['End with the line "#### <number>".', 'The last line must be "#### <number>".']


def _user(messages: list[dict[str, str]]) -> str:
    return messages[-1]["content"]


def test_a_variant_replaces_the_instruction_or_the_system_prompt_and_nothing_else():
    task = get_task("gsm8k")
    worded = phrasing.rephrased(task, Phrasing("worded", instruction=OTHERS[0]))
    messages = worded.build_messages(ROW, "the run's system prompt")
    assert messages[0] == {"role": "system", "content": "the run's system prompt"}
    assert _user(messages) == f"{ROW['question']}\n\n{OTHERS[0]}"
    tutor = phrasing.rephrased(task, Phrasing("tutor", system_prompt="You are a tutor."))
    messages = tutor.build_messages(ROW, "the run's system prompt")
    assert messages[0]["content"] == "You are a tutor." and ANSWER_INSTRUCTION in _user(messages)
    assert task.build_messages(ROW, "s") != worded.build_messages(ROW, "s")  # the task untouched


def test_training_asks_each_question_with_one_instruction_the_same_every_time():
    task = phrasing.varied(get_task("gsm8k"), [ANSWER_INSTRUCTION, *OTHERS])
    rows = [{**ROW, "question": f"Question number {i}?"} for i in range(60)]
    asked = [_user(task.build_messages(r, "")) for r in rows]
    assert asked == [_user(task.build_messages(r, "")) for r in rows]  # a redraw: the same
    used = {i for i in (ANSWER_INSTRUCTION, *OTHERS) for a in asked if a.endswith(i)}
    assert used == {ANSWER_INSTRUCTION, *OTHERS}  # all three in use over 60 questions
    assert phrasing.varied(get_task("gsm8k"), []) is get_task("gsm8k")


def test_variant_entries_are_checked_in_one_line():
    assert parse_variants([{"name": "a", "instruction": "x"}]) == (Phrasing("a", "x", None),)
    for bad, why in [
        ([{"instruction": "x"}], "name must be a word"),
        ([{"name": "a b", "instruction": "x"}], "name must be a word"),
        ([{"name": "a"}], "set instruction, system_prompt or both"),
        ([{"name": "a", "instruction": 3}], "instruction must be a string"),
        ([{"name": "a", "prompt": "x"}], "unknown key 'prompt'"),
        ([{"name": "a", "instruction": "x"}, {"name": "a", "instruction": "y"}], "a second"),
    ]:
        with pytest.raises(ConfigError, match=f"eval.prompt_variants: entry .*{why}"):
            load_config(None, [f"eval.prompt_variants={bad!r}"])
    with pytest.raises(ConfigError, match=r"eval.prompt_variants\[0\] must be dict"):
        load_config(None, ["eval.prompt_variants=[x]"])  # the loader's own type check


@pytest.mark.parametrize(
    "overrides, why",
    [
        # The task's own instruction with the run's system prompt: the training prompt again.
        ([f"eval.prompt_variants=[{{name: same, instruction: '{ANSWER_INSTRUCTION}'}}]"],
         "eval.prompt_variants: variant 'same' is a phrasing training uses"),
        # One of data.instructions is training's too.
        ([f"data.instructions=['{OTHERS[0]}']",
          f"eval.prompt_variants=[{{name: listed, instruction: '{OTHERS[0]}'}}]"],
         "variant 'listed' is a phrasing training uses"),
        # The run's system prompt, named again.
        (["data.system_prompt=S", "eval.prompt_variants=[{name: sys, system_prompt: S}]"],
         "variant 'sys' is a phrasing training uses"),
        # The prompts task's questions carry their own words: only a system prompt may vary.
        (["data.task=prompts", "data.train=x.jsonl", "data.test=x.jsonl",
          "eval.prompt_variants=[{name: w, instruction: x}]"],
         "task 'prompts' declares no answer instruction to vary"),
        (["data.task=prompts", "data.train=x.jsonl", "data.instructions=[x]"],
         "data.instructions: task 'prompts' declares no answer instruction"),
        # A mixture's entries are several tasks: no one instruction to replace.
        (["data.mixture=[{train: a, task: gsm8k}, {train: b, task: math}]",
          "eval.prompt_variants=[{name: w, instruction: x}]"],
         "eval.prompt_variants is not offered with data.mixture"),
    ],
)  # fmt: skip
def test_a_variant_training_uses_or_a_task_cannot_ask_is_refused_before_the_run(overrides, why):
    from grpo.plan import check_names

    with pytest.raises(ConfigError, match=why):
        check_names(load_config(None, overrides))


def test_unseen_phrasings_pass_the_check():
    from grpo.plan import check_names

    check_names(load_config(None, [
        f"data.instructions=['{OTHERS[0]}']",
        # the task's own instruction is unseen once data.instructions does not list it
        f"eval.prompt_variants=[{{name: own, instruction: '{ANSWER_INSTRUCTION}'}}, "
        "{name: sys, system_prompt: 'Another system prompt.'}]",
    ]))  # fmt: skip


def test_the_evaluation_asks_each_variant_in_its_own_words(tiny_model_dir):
    """What the trainer's evaluation and `grpo eval` encode: the variant's instruction (or
    system prompt) in every prompt, the training one in none of them, the same questions."""
    from grpo.eval.questions import eval_prompts, variant_prompts
    from grpo.models.loading import load_tokenizer

    variants = (f"[{{name: worded, instruction: '{OTHERS[1]}'}}, "
                "{name: tutor, system_prompt: 'You are a patient tutor.'}]")  # fmt: skip
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "eval.num_questions=3",
                             f"data.instructions=['{OTHERS[0]}']",
                             f"eval.prompt_variants={variants}"])  # fmt: skip
    tokenizer = load_tokenizer(tiny_model_dir)
    task = get_task("gsm8k")
    text = lambda prompts: [tokenizer.decode(p.ids.tolist()) for p in prompts]  # noqa: E731
    main = text(eval_prompts(cfg, task, tokenizer))
    asked = {name: text(p) for name, p in variant_prompts(cfg, task, tokenizer).items()}
    assert sorted(asked) == ["tutor", "worded"]
    assert all(OTHERS[0] in t for t in main)  # the training phrasing
    assert all(OTHERS[1] in t and OTHERS[0] not in t for t in asked["worded"])
    # The tutor's system prompt, with the task's instruction (data.instructions is training's).
    assert all("You are a patient tutor." in t and cfg.data.system_prompt not in t
               for t in asked["tutor"])  # fmt: skip
    questions = [p.row["question"] for p in eval_prompts(cfg, task, tokenizer)]
    for prompts in variant_prompts(cfg, task, tokenizer).values():
        assert [p.row["question"] for p in prompts] == questions
