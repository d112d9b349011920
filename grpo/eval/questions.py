"""Evaluation of one version on held-out questions: greedy pass@1 and format rate and, with
`eval.samples` answers sampled per question, pass@k by the unbiased estimator.

The trainer's ranks run it between steps on the weights they hold (grpo.trainer.loop), so
every `eval.interval`-th version is evaluated whichever versions the samplers load, and
generation never waits for it; `python -m grpo eval` runs it on a finished run's versions
(grpo.eval_cli). Each rank (or the one process) scores its share of the questions into
`QuestionResult`s; `summarise` turns all of them into the row of eval.jsonl.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from grpo.config import Config
from grpo.config.data import Phrasing, parse_variants
from grpo.observe.degeneration import CountMarkers, measures
from grpo.rollout.base import Generation, RolloutEngine, Sampling
from grpo.tasks import RewardRunner, Task, mixture, phrasing
from grpo.tasks.encoding import Prompt, encode_prompts


@dataclass(frozen=True)
class EvalSpec:
    """How a version is evaluated (from the config's eval and rollout sections)."""

    greedy: Sampling  # one greedy answer per question: pass@1 and the format rate
    # `samples` answers per question for pass@k (n 0: greedy only); each version and batch
    # offsets its seed
    sampled: Sampling
    ks: tuple[int, ...]  # the k of each pass@k reported

    @property
    def samples(self) -> int:
        """Answers sampled per question for pass@k; 0 = greedy only."""
        return self.sampled.n

    @classmethod
    def from_config(cls, cfg: Config) -> EvalSpec:
        e, r = cfg.eval, cfg.rollout
        greedy = Sampling(
            max_new_tokens=e.max_new_tokens,
            greedy=True,
            stop=tuple(r.stop),
            batch_size=r.generation_batch_size,
        )
        # With the rollout's temperature and top_p but not its top_k (docs/configuration.md,
        # eval.samples), seeded from train.seed.
        sampled = replace(
            greedy,
            greedy=False,
            n=e.samples,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=cfg.train.seed,
        )
        return cls(greedy, sampled, pass_ks(e.samples, e.k))


def pass_ks(samples: int, k: Sequence[int]) -> tuple[int, ...]:
    """The k reported: those asked for, or 1 and `samples`; none without samples."""
    if not samples:
        return ()
    return tuple(sorted(set(k))) if k else tuple(sorted({1, samples}))


@dataclass(frozen=True)
class QuestionResult:
    index: int  # the question's position among the evaluated ones
    greedy_correct: bool | None  # None: the reward's info does not say (a bare number)
    greedy_formatted: bool | None
    correct_samples: int = 0  # of the spec's `samples` sampled answers
    source: str = ""  # the mixture entry the question is from ('' for a single dataset)
    # The greedy answer, as text, with its reward and finish reason: for samples.jsonl.
    answer: str = ""
    reward: float = 0.0
    finish_reason: str = ""
    length: int = 0  # the greedy answer's tokens
    refused: bool = False  # the reward's info says it refused the answer (answer spam)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k answers drawn without replacement from n, c of
    them correct, is correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1), as a product that cannot overflow."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def eval_prompts(
    cfg: Config, task: Task, tokenizer, variant: Phrasing | None = None
) -> list[Prompt]:
    """The first `eval.num_questions` test questions (of each entry of a mixture), encoded as
    the sampler encodes them, or as prompt variant `variant` asks them."""
    n = cfg.eval.num_questions
    if cfg.data.mixture:
        rows = mixture.test_rows(cfg, n)
    else:
        rows = task.load(cfg.data.test or task.default_test)[:n]
    if variant is None:  # as training asks: one of data.instructions per question
        asked = phrasing.varied(task, cfg.data.instructions)
    else:
        asked = phrasing.rephrased(task, variant)
    return encode_prompts(
        asked, rows, tokenizer, cfg.data.system_prompt, cfg.data.max_prompt_tokens
    )


def variant_prompts(cfg: Config, task: Task, tokenizer) -> dict[str, list[Prompt]]:
    """Each of `eval.prompt_variants`' questions, by variant name (a mixture has none: the run
    plan refuses them)."""
    variants = parse_variants(cfg.eval.prompt_variants)
    return {v.name: eval_prompts(cfg, task, tokenizer, v) for v in variants}


def evaluation_sets(cfg: Config, task: Task, tokenizer) -> dict[str, list[Prompt]]:
    """The questions of an evaluation by set: the run's phrasing ('') first, then each prompt
    variant's; flattened in this order wherever one list answers them all (the trainer's ranks,
    the sampler's engine)."""
    return {"": eval_prompts(cfg, task, tokenizer), **variant_prompts(cfg, task, tokenizer)}


def variant_row(row: dict, name: str) -> dict:
    """A variant's eval row as keys of the main row: `accuracy@<name>`, `format_rate@<name>`..."""
    kept = ("accuracy", "format_rate", "n", "response_len_mean", "degenerate_frac",
            "degen_repeat_frac", "degen_multi_marker_frac")  # fmt: skip
    return {f"{k}@{name}": row[k] for k in kept if k in row}


@dataclass(frozen=True)
class Answered:
    """One question's answers as generated: the greedy one and `EvalSpec.samples` sampled."""

    greedy: Generation
    sampled: tuple[Generation, ...] = ()


def question_results(
    engine: RolloutEngine,
    prompts: Sequence[Prompt],
    indices: Sequence[int],
    tokenizer,
    rewards: RewardRunner,
    spec: EvalSpec,
    version: int,
    progress: bool = False,
) -> list[QuestionResult]:
    """Greedy and sampled answers to `prompts[i]` for each i in `indices`, scored."""
    answered = generate_answers(engine, prompts, indices, spec, version, progress)
    return score_answers(answered, prompts, indices, tokenizer, rewards, spec)


def generate_answers(
    engine: RolloutEngine,
    prompts: Sequence[Prompt],
    indices: Sequence[int],
    spec: EvalSpec,
    version: int,
    progress: bool = False,
) -> list[Answered]:
    """The answers to `prompts[i]` for each i in `indices`, a batch of questions at a time (the
    progress bar counts questions); scored apart (score_answers), where the run's reward is."""
    from tqdm import tqdm

    out: list[Answered] = []
    per_batch = max(1, spec.sampled.batch_size // max(1, spec.samples))
    # On a terminal only (disable=None): in a log file a bar is a line per update.
    bar = tqdm(
        total=len(indices),
        desc=f"eval v{version}",
        disable=None if progress else True,
        leave=False,
    )
    for start in range(0, len(indices), per_batch):
        ids = [prompts[i].ids for i in indices[start : start + per_batch]]
        greedy = engine.generate(ids, spec.greedy)
        sampled: list[Generation] = []
        if spec.samples:
            seed = spec.sampled.seed + version * 100_003 + start
            sampled = engine.generate(ids, replace(spec.sampled, seed=seed))
        n = spec.samples
        out += [Answered(g, tuple(sampled[j * n : (j + 1) * n])) for j, g in enumerate(greedy)]
        bar.update(len(ids))
    bar.close()
    return out


def score_answers(
    answered: Sequence[Answered],
    prompts: Sequence[Prompt],
    indices: Sequence[int],
    tokenizer,
    rewards: RewardRunner,
    spec: EvalSpec,
) -> list[QuestionResult]:
    """`answered[j]` (to `prompts[indices[j]]`) scored by the run's reward."""
    rows = [prompts[i].row for i in indices]
    greedy_texts, greedy_scored = _scored([a.greedy for a in answered], rows, tokenizer, rewards)
    sampled_rows = [row for row in rows for _ in range(spec.samples)]
    sampled = [g for a in answered for g in a.sampled]
    sampled_infos = [i for _, i in _scored(sampled, sampled_rows, tokenizer, rewards)[1]]
    out: list[QuestionResult] = []
    for j, index in enumerate(indices):
        mine_sampled = sampled_infos[j * spec.samples : (j + 1) * spec.samples]
        reward, info = greedy_scored[j]
        greedy = answered[j].greedy
        out.append(
            QuestionResult(
                index=index,
                greedy_correct=_said(info, "correct"),
                greedy_formatted=_said(info, "formatted"),
                correct_samples=sum(bool(i.get("correct")) for i in mine_sampled),
                source=str(prompts[index].row.get(mixture.SOURCE_KEY, "")),
                answer=greedy_texts[j],
                reward=float(reward),
                finish_reason=greedy.finish_reason,
                length=len(greedy.completion_ids),
                refused="refused" in info,
            )
        )
    return out


def _said(info: dict, key: str) -> bool | None:
    return bool(info[key]) if key in info else None


def _scored(
    gens: Sequence, rows: Sequence[dict], tokenizer, rewards: RewardRunner
) -> tuple[list[str], list[tuple[float, dict]]]:
    """The texts of answers `gens` to the questions `rows` (one row per answer) and their
    (reward, info); a call past reward.timeout_s counts as neither correct nor formatted."""
    if not gens:  # batch_decode([]) is [""], one empty answer
        return [], []
    texts = tokenizer.batch_decode([g.completion_ids for g in gens], skip_special_tokens=True)
    return texts, rewards.score_all(list(zip(texts, rows, strict=True)))


def summarise(
    results: Sequence[QuestionResult],
    spec: EvalSpec,
    version: int,
    seconds: float,
    count_markers: CountMarkers | None = None,
) -> dict:
    """The eval.jsonl row: pass@1 greedy ("accuracy"), format rate, and each pass@k as the
    mean over questions of the unbiased estimate; for a mixture, each of them per entry too
    (``accuracy/<name>``, ``n/<name>``...); the greedy answers' mean length and degeneration
    measures (grpo.observe.degeneration; `count_markers`: the task's)."""
    overall = _rates(results, spec, "")
    row: dict = {
        "version": version,
        **{k: overall.pop(k) for k in ("accuracy", "format_rate", "n") if k in overall},
    }
    if spec.samples and results:  # before the pass@k, as eval.jsonl has always had it
        row["samples"] = spec.samples
    row.update(overall)
    if results:
        row["response_len_mean"] = sum(r.length for r in results) / len(results)
        texts, rewards = [r.answer for r in results], [r.reward for r in results]
        row.update(measures(texts, rewards, [r.refused for r in results], count_markers))
    for name in sorted({r.source for r in results if r.source}):
        row.update(_rates([r for r in results if r.source == name], spec, f"/{name}"))
    row["seconds"] = round(seconds, 2)
    return row


def _rates(results: Sequence[QuestionResult], spec: EvalSpec, suffix: str) -> dict:
    """accuracy, format_rate, n and each pass@k of `results`, each key ending in `suffix`; a
    rate no result's reward reports is left out (pass@k with accuracy), not shown as 0."""
    n = len(results)
    row: dict = {}
    for name, said in (
        ("accuracy", [r.greedy_correct for r in results]),
        ("format_rate", [r.greedy_formatted for r in results]),
    ):
        if any(s is not None for s in said):
            row[f"{name}{suffix}"] = sum(bool(s) for s in said) / max(n, 1)
    row[f"n{suffix}"] = n
    if spec.samples and n and f"accuracy{suffix}" in row:
        for k in spec.ks:
            estimates = [pass_at_k(spec.samples, r.correct_samples, k) for r in results]
            row[f"pass@{k}{suffix}"] = sum(estimates) / n
    return row


def evaluate_answers(
    engine: RolloutEngine,
    prompts: Sequence[Prompt],
    tokenizer,
    rewards: RewardRunner,
    spec: EvalSpec,
    version: int,
    progress: bool = False,
    count_markers: CountMarkers | None = None,
) -> tuple[dict, list[QuestionResult]]:
    """All of `prompts` in this process: the eval.jsonl row of `version`, and the scored answers
    it summarises (to show: grpo eval --show)."""
    t0 = time.monotonic()
    results = question_results(
        engine, prompts, range(len(prompts)), tokenizer, rewards, spec, version, progress
    )
    return summarise(results, spec, version, time.monotonic() - t0, count_markers), results
