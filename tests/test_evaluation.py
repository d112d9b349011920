"""Evaluation: the pass@k estimator against its definition, the eval row from per-question
results, a real evaluation of the tiny model, and the trackers read back from their files."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo.config import ConfigError, load_config
from grpo.eval.questions import (
    EvalSpec,
    QuestionResult,
    eval_prompts,
    evaluate_answers,
    pass_at_k,
    pass_ks,
    question_results,
    summarise,
)
from grpo.observe.run_log import RunLog, scalars_of
from grpo.rollout.base import Sampling


def spec(samples: int = 0, ks: tuple[int, ...] = (), max_new_tokens: int = 8,
         batch_size: int = 8) -> EvalSpec:  # fmt: skip
    greedy = Sampling(max_new_tokens=max_new_tokens, greedy=True, batch_size=batch_size)
    return EvalSpec(greedy, replace(greedy, greedy=False, n=samples), ks)


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                         st.integers(1, n))))  # fmt: skip
def test_pass_at_k_is_the_chance_that_some_k_subset_holds_a_correct_answer(nck):
    """Enumerate every k-subset of n answers (c correct): the fraction with a correct one."""
    n, c, k = nck
    answers = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    exact = sum(any(answers[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(pass_at_k(n, c, k), exact, abs_tol=1e-12)
    assert math.isclose(pass_at_k(n, c, k), 1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_hand_values_and_bad_input():
    assert pass_at_k(4, 1, 1) == 0.25  # one of four right: a single draw finds it 1 in 4
    assert math.isclose(pass_at_k(4, 1, 2), 0.5)  # 3 of the 6 pairs hold it
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(200, 100, 150) == 1.0  # more draws than wrong answers
    for n, c, k in ((4, 5, 1), (4, 1, 5), (4, 1, 0), (3, -1, 1)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_summarise_averages_the_estimates_over_questions():
    results = [
        QuestionResult(0, greedy_correct=True, greedy_formatted=True, correct_samples=4),
        QuestionResult(1, greedy_correct=False, greedy_formatted=True, correct_samples=1),
        QuestionResult(2, greedy_correct=False, greedy_formatted=False, correct_samples=0),
        QuestionResult(3, greedy_correct=False, greedy_formatted=True, correct_samples=2),
    ]
    row = summarise(results, spec(4, (1, 2, 4)), version=7, seconds=1.234)
    assert row["version"] == 7 and row["n"] == 4 and row["samples"] == 4
    assert row["accuracy"] == 0.25 and row["format_rate"] == 0.75
    assert math.isclose(row["pass@1"], (1 + 0.25 + 0 + 0.5) / 4)
    assert math.isclose(row["pass@2"], (1 + 0.5 + 0 + 5 / 6) / 4)
    assert math.isclose(row["pass@4"], 3 / 4) and row["seconds"] == 1.23
    assert "pass@1" not in summarise(results, spec(), 7, 0.0)  # greedy only


def test_pass_ks_and_the_config_checks():
    assert pass_ks(0, []) == () and pass_ks(8, []) == (1, 8) and pass_ks(8, [4, 1, 4]) == (1, 4)
    cfg = load_config(None, ["eval.samples=8", "eval.k=[1,4,8]", "eval.interval=1"])
    assert EvalSpec.from_config(cfg).ks == (1, 4, 8)
    for overrides, message in (
        (["eval.k=[2]"], "eval.k needs eval.samples > 0"),
        (["eval.samples=4", "eval.k=[1,5]"], r"between 1 and eval.samples \(4\), got \[5\]"),
        (["eval.samples=-1"], "eval.samples must be >= 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)


@pytest.fixture(scope="module")
def tiny_eval(tiny_model_dir):
    """The tiny model's HF engine and the first 6 GSM8K test prompts."""
    from grpo.models.loading import load_causal_lm, load_tokenizer
    from grpo.rollout.hf import HFRollout
    from grpo.tasks import get_task

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "eval.num_questions=6",
                             "eval.interval=1", "eval.max_new_tokens=10"])  # fmt: skip
    tokenizer = load_tokenizer(tiny_model_dir)
    prompts = eval_prompts(cfg, get_task("gsm8k"), tokenizer)
    engine = HFRollout(load_causal_lm(tiny_model_dir).eval(), tokenizer)
    return engine, prompts, tokenizer


def test_a_real_evaluation_of_the_tiny_model(tiny_eval):
    """6 questions, greedy plus 6 samples each, scored by answer-length parity: the sampled
    pass@k grow with k, greedy is the same however the questions are split (as over ranks)."""
    from grpo.tasks import RewardRunner
    from tests.rewards_for_tests import even_length_is_correct

    engine, prompts, tokenizer = tiny_eval
    s = spec(6, (1, 3, 6), max_new_tokens=10, batch_size=12)
    reward = RewardRunner(even_length_is_correct, workers=3, timeout_s=60)
    row, _ = evaluate_answers(engine, prompts, tokenizer, reward, s, version=0)
    assert row["n"] == 6 and row["samples"] == 6 and len(prompts) == 6
    assert 0 < row["pass@1"] < 1, row  # a random model's lengths: some right, some wrong
    assert row["pass@1"] <= row["pass@3"] <= row["pass@6"] <= 1
    # Two "ranks", each with every other question, give the same greedy answers and samples.
    halves = [question_results(engine, prompts, range(r, 6, 2), tokenizer, reward, s, 0)
              for r in (0, 1)]  # fmt: skip
    merged = sorted((q for h in halves for q in h), key=lambda q: q.index)
    whole = question_results(engine, prompts, range(6), tokenizer, reward, s, 0)
    assert [q.greedy_correct for q in merged] == [q.greedy_correct for q in whole]
    assert [q.greedy_formatted for q in merged] == [q.greedy_formatted for q in whole]
    no_samples = replace(s, sampled=replace(s.sampled, n=0), ks=())
    greedy_only, _ = evaluate_answers(engine, prompts, tokenizer, reward, no_samples, 0)
    assert greedy_only["accuracy"] == row["accuracy"] and "pass@1" not in greedy_only
    reward.close()


def test_a_step_s_numbers_go_to_the_tracker_group_they_belong_to():
    """Issue 64, item 7: delivery counters and the sampler's numbers were filed under train/
    beside reward and loss. Every counter the real trainer endpoint reports is delivery/."""
    from tests.test_transport import _cfg, trainer_endpoint

    endpoint = trainer_endpoint(_cfg())
    try:
        counters = endpoint.counters()
    finally:
        endpoint.close()
    assert counters
    row = {**dict.fromkeys(counters, 1), "staleness": 0, "reward_mean": 0.1, "loss": 0.2,
           "response_len_mean": 30.0, "sampler_gen_s": 4.0, "sampler_tokens_per_s": 90.0,
           "flat_groups_frac": 0.5, "entropy": 0.9}  # fmt: skip
    tags = scalars_of(row, "train")
    assert {t for t in tags if t.startswith("delivery/")} == {
        f"delivery/{k}" for k in [*counters, "staleness"]
    }
    assert {t for t in tags if not t.startswith("delivery/")} == {
        "train/reward_mean", "train/loss", "train/entropy", "rollout/response_len_mean",
        "time/sampler_gen_s", "rollout/sampler_tokens_per_s", "rollout/flat_groups_frac",
    }  # fmt: skip


def test_scalars_keep_finite_numbers_under_their_section():
    row = {"step": 3, "kl": 0.5, "train_s": 2.0, "loss": float("nan"), "flag": True,
           "sampler_id": "sampler-0", "completion_lens": [1, 2], "time": 1e9}  # fmt: skip
    assert scalars_of(row, "train") == {"train/kl": 0.5, "time/train_s": 2.0}
    assert scalars_of({"version": 4, "pass@4": 0.5, "seconds": 3}, "eval") == {
        "eval/pass@4": 0.5, "eval/seconds": 3.0
    }  # fmt: skip


def _tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    # TensorBoard stores float32: compare at its precision.
    return {
        t: [(e.step, pytest.approx(e.value, rel=1e-6)) for e in acc.Scalars(t)]
        for t in acc.Tags()["scalars"]
    }


def test_run_log_writes_jsonl_and_tensorboard_and_a_resume_purges_later_steps(tmp_path):
    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run"])
    log = RunLog(cfg)
    for step in (1, 2, 3):
        log.step({"step": step, "reward_mean": step / 10, "train_s": 1.5})
    log.eval({"version": 3, "accuracy": 0.25, "format_rate": 1.0, "n": 4, "pass@2": 0.5})
    log.close()
    run_dir = tmp_path / "run"
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    got = _tensorboard_scalars(run_dir)
    assert got["train/reward_mean"] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert got["time/train_s"][0] == (1, 1.5)
    assert got["eval/pass@2"] == [(3, 0.5)] and got["eval/accuracy"] == [(3, 0.25)]
    # Resumed after step 1's state: steps 2 and 3 are redone and shown once, the new values.
    log = RunLog(cfg, resumed_step=1)
    for step in (2, 3):
        log.step({"step": step, "reward_mean": 1.0 + step})
    log.close()
    assert _tensorboard_scalars(run_dir)["train/reward_mean"] == [(1, 0.1), (2, 3.0), (3, 4.0)]


def test_tensorboard_off_writes_no_event_files(tmp_path):
    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run", "logging.tensorboard=false"])
    log = RunLog(cfg)
    log.step({"step": 1, "reward_mean": 0.5})
    log.close()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["metrics.jsonl"]


def _wandb_history(run_file) -> dict[str, str]:
    """The history items in an offline run's .wandb file: a LevelDB-style log (a 7-byte file
    header, then 32 KiB blocks of records: crc32, length, type (1 whole, 2-4 first, middle,
    last)) of protobuf Records. W&B's own reader lives in its Go core."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    raw, block, pos, records, part = run_file.read_bytes(), 32768, 7, [], b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            records.append(part + data if kind == 4 else data)
        elif kind in (2, 3):
            part = data if kind == 2 else part + data
        else:
            break
    history = {}
    for data in records:
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            history |= {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
    return history


def test_wandb_offline_run_records_the_scalars(tmp_path, monkeypatch):
    """A real W&B run in offline mode (no network), read back from the file it wrote."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run", "logging.tensorboard=false",
                             "logging.wandb=offline"])  # fmt: skip
    from tests.test_episode import make_batch

    log = RunLog(cfg, tokenizer=_WordTokenizer())
    log.step({"step": 1, "reward_mean": 0.5, "kl": 0.01}, make_batch())
    log.eval({"version": 1, "accuracy": 0.25, "format_rate": 1.0, "n": 4})
    log.close()
    (run_file,) = (tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb")
    got = _wandb_history(run_file)
    wanted = ("train/reward_mean", "train/kl", "eval/accuracy")
    assert [got[k] for k in wanted] == ["0.5", "0.01", "0.25"]
    # the step's answers, as a W&B table
    assert (got["samples/_type"], got["samples/nrows"], got["samples/ncols"]) == (
        '"table-file"',
        "2",
        "5",
    )
    # A resumed run goes on in the same W&B run (a second offline run dir of the same id).
    log = RunLog(cfg, resumed_step=1)
    log.step({"step": 2, "reward_mean": 0.75})
    log.close()
    runs = sorted(p.name for p in (tmp_path / "run").glob("wandb/offline-run-*"))
    # offline-run-<time>-<run id>, and "-1" after it when both started in the same second
    ids = {re.match(r"offline-run-\d+_\d+-([^-]+)", name).group(1) for name in runs}
    assert len(runs) == 2 and len(ids) == 1, runs


def test_a_missing_tracker_is_named_before_the_run(monkeypatch):
    import importlib.util

    from grpo.plan import check_names

    real = importlib.util.find_spec
    without_wandb = lambda name, *a: None if name == "wandb" else real(name, *a)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", without_wandb)
    cfg = load_config(None, ["logging.wandb=offline"])
    with pytest.raises(ConfigError, match="logging.wandb: the wandb package is not installed"):
        check_names(cfg)


def test_each_step_writes_its_best_and_worst_answers_as_text(tmp_path, capsys):
    """samples.jsonl: logging.samples_per_step answers of each step, best reward first and
    worst last, prompt and answer decoded, with their reward's parts and version; TensorBoard
    shows them as text; `python -m grpo samples` prints the newest; a resume drops the crashed
    run's later ones."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpo.observe.samples import main as samples_main
    from grpo.trainer.outputs import open_run_dir
    from tests.test_episode import make_batch

    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run", "logging.samples_per_step=3"])
    log = RunLog(cfg, tokenizer=_WordTokenizer())
    batches = {step: make_batch(seed=step) for step in (1, 2)}
    for step, batch in batches.items():
        log.step({"step": step, "reward_mean": 0.5}, batch)
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "run/samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2]
    for step, batch in batches.items():
        mine = [r for r in rows if r["step"] == step]
        rewards = sorted(e.reward for e in batch.episodes)
        first, middle, last = (r["reward"] for r in mine)
        assert first == rewards[-1] and last == rewards[0] and middle in rewards[1:-1]
        best = max(batch.episodes, key=lambda e: e.reward)
        assert mine[0]["answer"] == " ".join(f"t{i}" for i in best.completion_ids)
        assert mine[0]["prompt"] == " ".join(f"t{i}" for i in best.prompt_ids)
        assert mine[0]["reward_info"] == best.reward_info and mine[0]["version"] == 5
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [1, 2]

    assert samples_main([str(tmp_path / "run"), "-n", "2"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("== step 2: ") == 2 and "== step 1: " not in shown
    assert f"reward {rows[-1]['reward']:.3f}" in shown
    open_run_dir(cfg, start_step=1)  # resumed after step 1: step 2 is redone
    kept = (tmp_path / "run/samples.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in kept] == [1, 1, 1]
    assert samples_main([str(tmp_path / "nowhere")]) == 2


def test_a_reward_that_reports_no_parts_shows_no_accuracy_or_format(tmp_path):
    """A reward returning a bare number says nothing of correctness or format: its rows, the
    run summary and the plot leave accuracy and format rate out (they showed 0.00 everywhere);
    one that reports `correct` alone gets accuracy alone."""
    import dataclasses

    from grpo.core.episode import EpisodeBatch
    from grpo.observe.metrics import per_sampler, plot_run
    from grpo.trainer.outputs import batch_metrics
    from tests.test_episode import make_batch

    def with_infos(info):
        batch = make_batch()
        episodes = [dataclasses.replace(e, reward_info=dict(info)) for e in batch.episodes]
        return EpisodeBatch(episodes, batch.group_size, 5, 17)

    bare = batch_metrics(with_infos({}))
    assert "accuracy" not in bare and "format_rate" not in bare and "reward_mean" in bare
    only_correct = batch_metrics(with_infos({"correct": True}))
    assert only_correct["accuracy"] == 1.0 and "format_rate" not in only_correct
    rows = [{"step": s, "sampler_id": "sampler-0", "staleness": 0, **bare} for s in (1, 2)]
    assert "accuracy" not in per_sampler(rows)["sampler-0"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_run(run_dir).is_file()


def test_a_new_run_of_the_same_name_keeps_every_older_one(tmp_path):
    """The previous run moves to <name>.1, the one before to <name>.2: none is deleted (a
    second rerun deleted the first run's <name>.prev)."""
    from grpo.trainer.outputs import rotate_run_dir

    run = tmp_path / "run"
    for n in range(3):
        rotate_run_dir(run)
        (run / "metrics.jsonl").write_text(f"{n}\n")
    rotate_run_dir(run)
    assert not any(run.iterdir())
    kept = {p.name: (p / "metrics.jsonl").read_text() for p in tmp_path.glob("run.*")}
    assert kept == {"run.1": "2\n", "run.2": "1\n", "run.3": "0\n"}


class _WordTokenizer:
    """Token i is the word t<i>."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"t{i}" for i in ids)


def test_in_a_log_file_each_step_is_a_line_not_a_bar(tmp_path, caplog, capfd):
    """No progress bar, whose redraws ran into the log lines of a log file (and the roles'
    lines into it on a terminal): each step is one log line (grpo.observe.step_line)."""
    import logging

    cfg = load_config(None, [f"output_dir={tmp_path}", "name=run", "train.total_steps=3",
                             "logging.tensorboard=false"])  # fmt: skip
    log = RunLog(cfg)
    with caplog.at_level(logging.INFO, logger="grpo.trainer"):
        log.step({"step": 1, "reward_mean": 0.25, "kl": 0.001})
    log.close()
    assert "step 1/3 |     - s | ETA - | reward 0.250 | kl 0.0010" in caplog.text
    assert "\r" not in capfd.readouterr().err


def test_an_evaluation_of_a_reward_that_reports_no_parts_has_no_accuracy_or_format():
    """The eval row (and pass@k, which counts correct answers) leaves out what the reward's
    info does not say, as the training rows do."""
    from grpo.eval.questions import EvalSpec, QuestionResult, summarise

    spec = EvalSpec.from_config(load_config(None, ["eval.samples=2"]))
    bare = [QuestionResult(i, None, None, 0) for i in range(3)]
    row = summarise(bare, spec, version=2, seconds=1.0)
    # and the answers' own measures, which need no reward info (grpo.observe.degeneration)
    measured = {"response_len_mean", "degenerate_frac", "degen_repeat_frac"}
    assert set(row) == {"version", "n", "samples", "seconds", *measured}, row
    formatted_only = [QuestionResult(i, None, i > 0, 0) for i in range(3)]
    row = summarise(formatted_only, spec, version=2, seconds=1.0)
    assert row["format_rate"] == pytest.approx(2 / 3) and "accuracy" not in row
