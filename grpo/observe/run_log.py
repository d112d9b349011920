"""Where the trainer's rows go: metrics.jsonl and eval.jsonl always (the run's record, which the
plot, the benchmarks and a resume read), a few answers of each step as text to samples.jsonl
(grpo/observe/samples.py), and the scalars and answers to the trackers people already use:
TensorBoard event files in the run dir (`logging.tensorboard`), and W&B when it is installed
and asked for (`logging.wandb: online | offline`; offline needs no network).

A tracker is a `Sink`; a row's finite numbers go to it under `train/`, `rollout/`,
`delivery/`, `time/` (the stage timings, keys ending in `_s`) or `eval/` (group_of), against
the step (a version is the step it ends).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from grpo.config import Config
from grpo.core.episode import EpisodeBatch
from grpo.observe.degeneration import BASELINE_STEPS, Watch, flags
from grpo.observe.metrics import EVAL_FILE, METRICS_FILE, append_jsonl, read_jsonl
from grpo.observe.samples import ANSWERS_KEY, SAMPLES_FILE, SAMPLES_KEY, as_markdown, sample_rows
from grpo.observe.step_line import StepClock, step_line

log = logging.getLogger("grpo.trainer")
WANDB_ID_FILE = "wandb_run_id"

# A row's numbers that are labels or clocks, not measurements.
_NOT_SCALARS = {"step", "version", "batch_seq", "policy_version", "published_version", "time"}


class Sink(Protocol):
    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def samples(self, step: int, rows: list[dict[str, Any]], tag: str) -> None: ...

    def close(self) -> None: ...


# A step row's delivery counters (grpo.delivery.trainer_endpoint's counters()) and what it
# says of the batch's making, each in a tracker group of its own: beside reward and loss under
# train/ they buried both (issue 64).
DELIVERY = frozenset(
    {
        "duplicates_dropped",
        "rejected_frames",
        "refused_messages",
        "rejected_batches",
        "refused_evals",
        "stale_batches",
        "samplers_alive",
        "staleness",
    }
)
ROLLOUT = frozenset(
    {
        "response_len_mean",
        "truncated_frac",
        "flat_groups_frac",
        "reward_errors",
        "reward_timeouts",
        "tool_token_frac",
        "turns_mean",
        "tool_calls_mean",
        "tool_errors_mean",
    }
)


def group_of(key: str, section: str) -> str:
    """The tracker group of a row's `key`: eval/ for an evaluation's; of a step's, time/ (the
    stage timings, ending in `_s`; a rate `_per_s` is not one), delivery/, rollout/ (the
    sampler's own numbers, `sampler_*`, and the answers' lengths and failures), else train/
    (reward, loss, KL, entropy...)."""
    if section != "train":
        return section
    if key.endswith("_s") and not key.endswith("_per_s"):  # seconds, not a rate
        return "time"
    if key in DELIVERY:
        return "delivery"
    if key in ROLLOUT or key.startswith("sampler_"):
        return "rollout"
    return "train"


def scalars_of(row: dict[str, Any], section: str) -> dict[str, float]:
    """`row`'s finite numbers as tracker tags: `eval/accuracy`, `train/kl`, `time/train_s`,
    `delivery/rejected_batches`, `rollout/response_len_mean`."""
    out = {}
    for key, value in row.items():
        if key in _NOT_SCALARS or isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            out[f"{group_of(key, section)}/{key}"] = float(value)
    return out


class TensorBoardSink:
    """Event files in the run dir: `tensorboard --logdir <run dir>`. A resumed run purges the
    steps the crashed run logged after its saved state, as metrics.jsonl drops them."""

    def __init__(self, run_dir: Path, resumed_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            log_dir=str(run_dir), purge_step=resumed_step + 1 if resumed_step else None
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def samples(self, step: int, rows: list[dict[str, Any]], tag: str) -> None:
        self.writer.add_text(tag, as_markdown(rows), step)  # the TEXT tab
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run per training run: a resumed run goes on in the same W&B run (its id is kept in
    the run dir), its steps after the saved state rewritten."""

    def __init__(self, cfg: Config, mode: str, resumed_step: int = 0):
        import wandb

        id_file = cfg.run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if resumed_step and id_file.is_file() else ""
        if not run_id:
            run_id = secrets.token_hex(4)  # W&B ids: lower-case letters and digits
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        try:
            self.run = wandb.init(
                project=cfg.logging.wandb_project,
                name=cfg.name,
                dir=str(cfg.run_dir),
                mode=mode,
                config=asdict(cfg),
                id=run_id,
                resume="allow",
            )
        except Exception as e:  # its own errors are many lines; ours is one, naming the key
            raise ValueError(f"logging.wandb={mode}: wandb.init failed: {e}") from e

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, rows: list[dict[str, Any]], tag: str) -> None:
        import wandb

        columns = ["step", "version", "reward", "prompt", "answer"]
        table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
        self.run.log({tag: table}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns before W&B's service process has written the run out (an offline
        # run's file was often still empty); teardown waits for it, so a closed run is on disk.
        wandb.teardown()


class RunLog:
    """Rank 0's writer of metrics and eval rows, to the files and to every tracker asked for,
    and its line a step on the console (grpo.observe.step_line)."""

    def __init__(self, cfg: Config, resumed_step: int = 0, tokenizer: Any = None):
        """`tokenizer`: the run's, for the answers each step writes as text (none: no text)."""
        self.run_dir = cfg.run_dir
        self.decode = partial(tokenizer.decode, skip_special_tokens=True) if tokenizer else None
        self.samples_per_step = cfg.logging.samples_per_step
        from grpo.tasks import task_for  # lazy: the tasks' registry is the trainer's to import

        # A resumed run's baselines are its first rows, already written.
        self.watch = Watch(
            task_for(cfg).count_markers,
            read_jsonl(self.run_dir / METRICS_FILE)[:BASELINE_STEPS] if resumed_step else (),
            read_jsonl(self.run_dir / EVAL_FILE)[:1] if resumed_step else (),
        )
        self.sinks: list[Sink] = []
        if cfg.logging.tensorboard:
            self.sinks.append(TensorBoardSink(self.run_dir, resumed_step))
        if cfg.logging.wandb != "off":
            self.sinks.append(WandbSink(cfg, cfg.logging.wandb, resumed_step))
        # One line a step, on a terminal and in a log alike (grpo.observe.step_line): a bar's
        # redraws ran into the roles' log lines on a terminal, and a log had no ETA.
        self.total = cfg.train.total_steps
        self.clock = StepClock(self.total, time.monotonic())

    def step(self, row: dict[str, Any], batch: EpisodeBatch | None = None) -> None:
        """The step's metrics `row`, with the degeneration measures of its `batch`'s answers; and
        a few of those answers as text."""
        if batch is not None and self.decode is not None:
            c = batch.columns
            texts = [self.decode(e.completion_ids.tolist()) for e in batch.episodes]
            refused = ["refused" in i for i in c.reward_info]
            self.watch.step(row, texts, c.reward.tolist(), refused)
        append_jsonl(self.run_dir / METRICS_FILE, row)
        self._track(row["step"], scalars_of(row, "train"))
        if batch is not None and self.samples_per_step and self.decode is not None:
            answers = sample_rows(batch, row["step"], self.decode, self.samples_per_step)
            self._samples(row["step"], answers, "samples")
        seconds, eta = self.clock.tick(row["step"], time.monotonic())
        log.info("%s", step_line(row, self.total, seconds, eta))

    def eval(self, row: dict[str, Any]) -> None:
        """An evaluation's row, watched for degeneration (its greedy answers: ANSWERS_KEY); the
        answers to show (SAMPLES_KEY, if any) go to samples.jsonl."""
        answers = row.pop(SAMPLES_KEY, [])
        self.watch.eval(row, row.pop(ANSWERS_KEY, []))
        append_jsonl(self.run_dir / EVAL_FILE, row)
        self._track(row["version"], scalars_of(row, "eval"))
        self._samples(row["version"], answers, "eval_samples")

    def _samples(self, step: int, answers: list[dict[str, Any]], tag: str) -> None:
        for answer in answers:
            answer["flags"] = flags(answer["answer"], self.watch.count_markers)
            append_jsonl(self.run_dir / SAMPLES_FILE, answer)
        if answers:
            for sink in self.sinks:
                sink.samples(step, answers, tag)

    def _track(self, step: int, values: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.scalars(step, values)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


class SilentRunLog:
    """Every trainer rank but 0: its rows are rank 0's to write."""

    def step(self, row: dict[str, Any], batch: EpisodeBatch | None = None) -> None:
        pass

    def eval(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
