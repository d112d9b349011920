"""Data as users have it (grpo.tasks.sources, .prompts, .columns): verl's parquet schema read as
it is, HF dataset directories (save_to_disk's, and a hub repository's files), hub names from the
local Hugging Face cache when offline, and a column mapping for anything else; a short run on
GSM8K converted to verl's schema, scored by a verl-style compute_score."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo.config import ConfigError, load_config
from grpo.tasks import get_task, gsm8k, load_rows, score
from grpo.tasks.base import mapped
from tests.conftest import REPO, run_launch, transport_overrides

GSM8K_TRAIN = REPO / "data/gsm8k/train.jsonl"
# verl's GSM8K preprocessing (verl/examples/data_preprocess/gsm8k.py): the question, then this.
VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
VERL_COLUMNS = ["question=extra_info.question", "answer=reward_model.ground_truth"]
# Answers of every kind the GSM8K reward tells apart, for the first rows' gold answers.
ANSWERS = (  # worked answers (grpo.tasks.answer_form) where they hold a marker
    "Add what she bought on both days, so the total is {gold}.\n#### {gold}",  # right: 1.0
    "Each of the pens costs one dollar more, so it is\n#### {wrong}",  # worked, wrong: 0.1
    "The answer is {gold}",  # no marker: 0.0
    "Add what she bought on both days to get <answer>{gold}</answer>",  # right, another marker
    "Double the apples and take three away to get \\boxed{{{wrong}}}",  # worked, wrong
    "#### {gold}",  # no working: 0.0
)


def gsm8k_rows(n: int) -> list[dict]:
    with GSM8K_TRAIN.open() as f:
        return [json.loads(next(f)) for _ in range(n)]


def to_verl(rows: list[dict], split: str) -> list[dict]:
    """GSM8K rows in verl's schema, as its GSM8K preprocessing writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{row['question']} {VERL_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": gsm8k.parse_gold(row["answer"])},
            "extra_info": {"split": split, "index": i, **row},  # question, answer
        }
        for i, row in enumerate(rows)
    ]


def write_verl_parquet(path: Path, n: int) -> list[dict]:
    """The first `n` GSM8K train rows as verl's parquet at `path`; the original rows."""
    rows = gsm8k_rows(n)
    pq.write_table(pa.Table.from_pylist(to_verl(rows, "train")), path)
    return rows


def answers_for(row: dict) -> list[str]:
    gold = gsm8k.parse_gold(row["answer"])
    return [a.format(gold=gold, wrong=int(gold) + 1) for a in ANSWERS]


def test_verl_parquet_is_read_as_it_is(tmp_path):
    path = tmp_path / "train.parquet"
    originals = write_verl_parquet(path, 3)
    task = get_task("prompts")
    rows = task.load(str(path))
    assert rows == to_verl(originals, "train")  # nested structs come back as dicts
    messages = task.build_messages(rows[0], "Be brief.")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"{originals[0]['question']} {VERL_INSTRUCTION}"},
    ]
    with_system = {"prompt": [{"role": "system", "content": "mine"}, *rows[0]["prompt"]]}
    assert task.build_messages(with_system, "Be brief.")[0]["content"] == "mine"  # kept
    assert task.build_messages({"prompt": "2+2?"}, "")[0] == {"role": "user", "content": "2+2?"}


def test_verl_rows_score_as_gsm8k_without_a_reward_of_their_own(tmp_path):
    """The prompts task's own reward: the checker of the row's data_source (GSM8K's here)."""
    path = tmp_path / "train.parquet"
    originals = write_verl_parquet(path, 4)
    task = get_task("prompts")
    for verl_row, row in zip(task.load(str(path)), originals, strict=True):
        for answer in answers_for(row):
            assert score(task.reward, answer, verl_row) == score(gsm8k.reward, answer, row)
    unknown = {**task.load(str(path))[0], "data_source": "mine"}
    reward, info = score(task.reward, "#### 1", unknown)
    assert reward == 0.0 and "data.reward" in info["reward_error"]


def test_a_column_mapping_gives_gsm8k_its_keys(tmp_path):
    path = tmp_path / "train.parquet"
    originals = write_verl_parquet(path, 4)
    task = mapped(get_task("gsm8k"), VERL_COLUMNS)
    rows = task.load(str(path))
    assert [r["question"] for r in rows] == [r["question"] for r in originals]
    assert rows[0]["reward_model"]["style"] == "rule"  # the row's own columns stay
    for mine, row in zip(rows, originals, strict=True):
        assert task.build_messages(mine, "") == gsm8k.build_messages(row, "")
        for answer in answers_for(row):
            assert score(task.reward, answer, mine) == score(gsm8k.reward, answer, row)
    with pytest.raises(ValueError, match="row 0 has no 'question'"):
        get_task("gsm8k").load(str(path))  # without the mapping, as before
    with pytest.raises(ValueError, match="row 0 has no column 'extra_info.nope'"):
        mapped(get_task("gsm8k"), ["question=extra_info.nope"]).load(str(path))


def test_the_column_mapping_is_checked_with_the_config():
    cfg = load_config(None, ["rows.columns=[question=problem,answer=reward_model.ground_truth]"])
    assert cfg.rows.columns == ["question=problem", "answer=reward_model.ground_truth"]
    for bad in ("[question]", "[question=]", "[a=x,a=y]", "[q=a..b]"):
        with pytest.raises(ConfigError, match="rows.columns"):
            load_config(None, [f"rows.columns={bad}"])


def test_a_save_to_disk_directory(tmp_path):
    import datasets

    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_list(gsm8k_rows(3)),
        test=datasets.Dataset.from_list(gsm8k_rows(5)[3:]),
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert load_rows(str(tmp_path / "dict")) == gsm8k_rows(3)  # train, when none is named
    assert load_rows(f"{tmp_path / 'dict'}:test") == gsm8k_rows(5)[3:]
    with pytest.raises(ValueError, match="no split 'validation'; its splits: train, test"):
        load_rows(f"{tmp_path / 'dict'}:validation")
    splits["test"].save_to_disk(str(tmp_path / "one"))  # one Dataset: no split to name
    assert get_task("gsm8k").load(str(tmp_path / "one")) == gsm8k_rows(5)[3:]


def test_a_save_to_disk_directory_reads_only_files_inside_it(tmp_path):
    """Its index names the arrow files and split folders `datasets` reads: a name leading out
    of the directory is refused, in one line, before anything is read."""
    import datasets

    datasets.Dataset.from_list(gsm8k_rows(2)).save_to_disk(str(tmp_path / "elsewhere"))
    datasets.Dataset.from_list(gsm8k_rows(3)).save_to_disk(str(tmp_path / "one"))
    state = tmp_path / "one/state.json"
    index = json.loads(state.read_text())
    index["_data_files"] = [{"filename": "../elsewhere/data-00000-of-00001.arrow"}]
    state.write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"state.json names '\.\./elsewhere/.*', outside"):
        load_rows(str(tmp_path / "one"))

    datasets.DatasetDict(train=datasets.Dataset.from_list(gsm8k_rows(2))).save_to_disk(
        str(tmp_path / "dict")
    )
    (tmp_path / "dict/dataset_dict.json").write_text(json.dumps({"splits": ["../elsewhere"]}))
    with pytest.raises(ValueError, match=r"dataset_dict.json names '\.\./elsewhere', outside"):
        load_rows(str(tmp_path / "dict"))


def test_a_null_question_is_refused_naming_its_row(tmp_path):
    rows = gsm8k_rows(3)
    rows[1]["question"] = None
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"train.jsonl: row 1 has a null 'question'"):
        get_task("gsm8k").load(str(train))


def _hub_repo(root: Path, kind: str) -> Path:
    """A dataset repository's files as a download leaves them (`kind`: parquet or jsonl, one
    format for all, as `datasets` requires): splits named by file name, under data/."""
    (root / "data").mkdir(parents=True)
    for split, rows in (("train", gsm8k_rows(4)), ("test", gsm8k_rows(6)[4:])):
        path = root / f"data/{split}-00000-of-00001.{kind}"
        if kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), path)
        else:
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_a_hub_repository_directory(tmp_path):
    repo = _hub_repo(tmp_path / "gsm8k", "jsonl")
    assert load_rows(str(repo)) == gsm8k_rows(4)
    assert get_task("gsm8k").load(f"{repo}:test") == gsm8k_rows(6)[4:]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="could not read dataset directory"):
        load_rows(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no dataset named"):
        get_task("prompts").load(get_task("prompts").default_train)


def _load_offline(hf_home: Path, source: str) -> subprocess.CompletedProcess:
    """load_rows(source) in a fresh process (huggingface_hub reads HF_HOME once, on import)."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    code = f"import json, grpo.tasks as t; print(json.dumps(t.load_rows({source!r})))"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_hub_name_from_the_local_cache_offline(tmp_path):
    cache = tmp_path / "hf/hub/datasets--someone--gsm8k"
    _hub_repo(cache / "snapshots/0123abcd", "parquet")
    (cache / "refs").mkdir()
    (cache / "refs/main").write_text("0123abcd")
    found = _load_offline(tmp_path / "hf", "someone/gsm8k:default:test")
    assert found.returncode == 0, found.stderr[-2000:]
    assert json.loads(found.stdout.splitlines()[-1]) == gsm8k_rows(6)[4:]
    missing = _load_offline(tmp_path / "hf", "someone/else")
    assert missing.returncode != 0
    assert "'someone/else' is not in the local Hugging Face cache" in missing.stderr


@pytest.mark.slow
def test_a_run_on_gsm8k_in_verls_schema_with_a_verl_compute_score(tmp_path, tiny_model_dir):
    """verl's parquet, its prompts as they are, scored by a verl-style compute_score: every
    answer scored, none with a reward_error (a wrong argument would be one on every answer)."""
    write_verl_parquet(tmp_path / "train.parquet", 16)
    data = {"task": "prompts", "train": str(tmp_path / "train.parquet"),
            "reward": "tests.test_user_rewards:verl_fingerprint_score"}  # fmt: skip
    run_two_steps(tmp_path, tiny_model_dir, data)


def run_two_steps(tmp_path: Path, model_dir: Path, data: dict) -> None:
    """A 2-step run of the tiny model on `data`, whose reward is one of the fingerprint rewards
    of tests/test_user_rewards.py: every answer scored by it (each reward in its range, which
    no built-in checker's 0, 0.1 or 1 is), none with a reward_error (a wrong argument to the
    user's reward would be one on every answer)."""
    from tests.test_integration import tiny_config
    from tests.test_user_rewards import FINGERPRINT_LOW

    config = tiny_config(tmp_path, model_dir, train={"total_steps": 2, "num_ranks": 1},
                         data=data, reward={"workers": 1})  # fmt: skip
    proc = run_launch(config, transport_overrides(), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward_errors"] == 0, r
        # every value in [low, low + 0.03]: their mean is, and their spread at most 0.016 (one
        # answer scored 0 or 1 among them would move the spread past 0.04)
        assert FINGERPRINT_LOW <= r["reward_mean"] <= FINGERPRINT_LOW + 0.03, r
        assert r["reward_std"] <= 0.016, r
