import numpy as np
import pytest

from grpo.core.staleness import required_version
from grpo.sampler.data import question_order


@pytest.mark.parametrize(
    "seq, staleness, interval, expected",
    [
        (0, 0, 1, 0),
        (1, 0, 1, 1),
        (5, 0, 1, 5),  # on-policy: batch k uses version k
        (1, 1, 1, 0),
        (2, 1, 1, 1),  # one version of lag: overlap sampling and training
        (1, 0, 2, 0),
        (2, 0, 2, 2),
        (3, 0, 2, 2),
        (4, 0, 2, 4),  # only even versions exist
        (3, 1, 2, 2),
        (2, 1, 2, 0),
    ],
)
def test_required_version(seq, staleness, interval, expected):
    assert required_version(seq, staleness, interval) == expected


def _take(order, n):
    return [next(order) for _ in range(n)]


def test_question_order_covers_each_epoch_once_and_reshuffles():
    order = question_order(10, seed=3, shuffle=True)
    first, second = _take(order, 10), _take(order, 10)
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert first != second
    assert _take(question_order(10, seed=3, shuffle=True), 5) == first[:5]  # seeded


def test_question_order_without_shuffle_wraps_in_order():
    assert _take(question_order(3, seed=0, shuffle=False), 6) == [0, 1, 2, 0, 1, 2]


def test_hf_answers_end_at_the_first_stop_string(base_model_dir):
    """generate() pads a row that hit a stop string with EOS (the pad token here): the answer
    must end where the stop string appeared, as vLLM's does, with no EOS it never sampled."""
    from grpo.models.loading import load_tokenizer
    from grpo.rollout.hf import _cut_at_stop

    tok = load_tokenizer(base_model_dir)
    ids = np.asarray(tok("So the answer is 42. Done").input_ids + [tok.eos_token_id] * 3)
    cut, reason = _cut_at_stop(ids, "stop", tok, ["42."])
    assert reason == "stop" and tok.decode(cut.tolist()).endswith("42.")
    assert "42." not in tok.decode(cut[:-1].tolist())
    same, reason = _cut_at_stop(ids, "length", tok, ["####"])
    assert reason == "length" and same is ids


def test_shard_tokenizes_only_the_rows_it_draws_and_skips_long_ones(tmp_path, base_model_dir):
    import json

    from grpo.config import load_config
    from grpo.models.loading import load_tokenizer
    from grpo.sampler.data import Shard
    from grpo.tasks import get_task

    rows = [{"question": "What is 1 + 1?" + " Think." * (150 * (i % 3 == 1)),
             "answer": "#### 2"} for i in range(30)]  # fmt: skip
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"data.train={train}", "data.max_prompt_tokens=200",
                             "rollout.questions_per_step=4", "data.shuffle=false"])  # fmt: skip
    shard = Shard(cfg, get_task("gsm8k"), load_tokenizer(base_model_dir))
    encoded = []
    encode = shard.encode
    shard.encode = lambda row, **kw: encoded.append(row) or encode(row, **kw)
    assert [p.index for p in shard.draw()] == [0, 2, 3, 5]  # rows 1 and 4 are too long
    assert len(encoded) == 6 and shard.position == 6  # skipped rows count: resume skips them

    cfg = load_config(None, [f"data.train={train}", "data.max_prompt_tokens=5"])
    with pytest.raises(ValueError, match="no train prompt fits data.max_prompt_tokens=5"):
        Shard(cfg, get_task("gsm8k"), load_tokenizer(base_model_dir)).draw()


class CountingTokenizer:
    """A tokenizer that records the length of every text it tokenizes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def apply_chat_template(self, *args, **kwargs):
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def __call__(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.tokenizer(text, **kwargs)


def test_a_huge_row_is_skipped_without_being_tokenized(tmp_path, base_model_dir):
    """One 4 MB question (~8 s to tokenize at ~2 us a character, drawn again after every
    resume) is refused by its length in characters: nothing near its size is tokenized."""
    import json

    from grpo.config import load_config
    from grpo.models.loading import load_tokenizer
    from grpo.sampler.data import Shard
    from grpo.tasks import get_task
    from grpo.tasks.encoding import MAX_CHARS_PER_TOKEN

    rows = [{"question": "What is 1 + 1?", "answer": "#### 2"} for _ in range(3)]
    rows[1]["question"] = "Think. " * 600_000
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"data.train={train}", "data.max_prompt_tokens=64",
                             "rollout.questions_per_step=2", "data.shuffle=false"])  # fmt: skip
    tokenizer = CountingTokenizer(load_tokenizer(base_model_dir))
    shard = Shard(cfg, get_task("gsm8k"), tokenizer)
    assert [p.index for p in shard.draw()] == [0, 2] and shard.skipped == 1
    assert len(tokenizer.lengths) == 2 and max(tokenizer.lengths) <= 64 * MAX_CHARS_PER_TOKEN


def test_the_vllm_progress_bar_counts_even_under_tqdm_disable():
    """launch.sh starts the sampler with TQDM_DISABLE=1; vLLM divides by its bar's elapsed
    time, which a disabled bar reports as 0 (a ZeroDivisionError at the first answer). tqdm
    reads the variable when it is imported: hence a process of its own."""
    import os
    import subprocess
    import sys

    code = (
        "import time\n"
        "from grpo.rollout.vllm import _CountingBar\n"
        "bar = _CountingBar(total=2)\n"
        "time.sleep(0.01)\n"
        "bar.update()\n"
        "assert not bar.disable and bar.format_dict['elapsed'] > 0 and bar.n == 1\n"
    )
    env = {**os.environ, "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
