"""GSM8K: grade-school math word problems with a single numeric answer."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from . import answer_form
from .answer_form import Span
from .base import Row, Task, load_rows_with, question_messages, register_task

# Partial credit for an explicit, parseable answer marker: the early format signal that
# lets a small model learn *where* to put the answer before it learns to get it right.
FORMAT_REWARD = 0.1

ANSWER_INSTRUCTION = 'Give the final answer on its own line as "#### <number>".'

# Integer part with proper thousands groups ("1,234") or plain digits; optional decimals.
_NUM = r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(rf"(?P<num>{_NUM})(?:\s*/\s*(?P<den>{_NUM}))?")

# The answer markers are found by scanning, never by one pattern over the whole answer: a
# pattern with a quantifier before a lookahead or a lazy match backtracks over the text once per
# marker, quadratic time that a model can write (issue 29, finding 5). Every pattern below is
# matched at a fixed position and ends with its only quantifier, so it never backtracks.
#
# "#### N": the number must come first so markdown headings ("#### Step 2: ...") don't count.
_HASH = "####"
_BLANKS_RE = re.compile(r"[ \t]*")
_LEADERS_RE = re.compile(r"[ \t*$€£\\(]*")  # what may stand before the number: "#### $-5"
_NUMBER_START_RE = re.compile(r"[+\-−]?\.?\d")
_TAG_OPEN_RE = re.compile(r"<answer>", re.IGNORECASE)
_TAG_CLOSE_RE = re.compile(r"</answer>", re.IGNORECASE)
_BOXED_START_RE = re.compile(r"\\boxed\s*\{")
_BRACE_RE = re.compile(r"[{}]")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_GOLD_RE = re.compile(r"####[ \t]*([^\n]*)")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])[ \t]+|\n")
_RESULT_RE = re.compile(rf"=[ \t]*({_NUM})")

# LaTeX / typographic noise removed before looking for the number.
_REPLACEMENTS = (
    ("{,}", ","),  # LaTeX thousands separator 1{,}000
    ("\\,", ""),  # LaTeX thin space 1\,000
    ("\\!", ""),
    ("\\$", ""),
    ("\\%", ""),
    ("−", "-"),  # unicode minus
    ("$", ""),
    ("€", ""),
    ("£", ""),
    ("%", ""),
)


def _format_decimal(d: Decimal) -> str:
    """Canonical string: integers without a point, decimals without trailing zeros."""
    if d == d.to_integral_value():
        return str(int(d))  # also turns -0 into "0" and 1E+2 into "100"
    return format(d.normalize(), "f")


def _fraction_to_decimal(frac: Fraction) -> Decimal:
    den = frac.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den == 1:  # terminating decimal: exact
        return Decimal(frac.numerator) / Decimal(frac.denominator)
    return Decimal(repr(float(frac)))  # 1/3 etc.: a canonical float repr on both sides


def _plain(text: str) -> str:
    """`text` with LaTeX fractions as a/b and the typographic noise of `_REPLACEMENTS` removed."""
    text = _FRAC_RE.sub(r"\1/\2", text)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    return text


def normalize_number(s: str) -> str | None:
    """First number in ``s`` as a canonical string ("1,234.50 dollars" -> "1234.5")."""
    m = _NUMBER_RE.search(_plain(s.strip()))
    if m is None:
        return None
    try:
        value = Decimal(m["num"].replace(",", ""))
        if m["den"] is not None:
            den = Decimal(m["den"].replace(",", ""))
            if den == 0:
                return None
            value = _fraction_to_decimal(Fraction(value) / Fraction(den))
    except (InvalidOperation, ValueError):
        return None
    return _format_decimal(value)


def hash_spans(text: str) -> list[Span]:
    """Every ``#### N`` line: its content runs from the number to the end of the line. Linear:
    the blanks after a ``####`` are read once, for that ``####`` only (they hold no ``#``)."""
    found, pos = [], 0
    while (start := text.find(_HASH, pos)) >= 0:
        content = _BLANKS_RE.match(text, start + len(_HASH)).end()  # type: ignore[union-attr]
        number = _LEADERS_RE.match(text, content).end()  # type: ignore[union-attr]
        if _NUMBER_START_RE.match(text, number) is None:
            pos = start + 1  # a heading; a later "####" on its line may still be an answer
            continue
        end = text.find("\n", content)
        end = len(text) if end < 0 else end
        found.append((start, content, end))
        pos = end
    return found


def tag_spans(text: str) -> list[Span]:
    """Every ``<answer>...</answer>``, each closed by the first ``</answer>`` after it. Linear:
    once an opening has no close after it, no later one has either."""
    found, pos = [], 0
    while (opening := _TAG_OPEN_RE.search(text, pos)) is not None:
        closing = _TAG_CLOSE_RE.search(text, opening.end())
        if closing is None:
            break
        found.append((opening.start(), opening.end(), closing.start()))
        pos = closing.end()
    return found


def boxed_spans(text: str) -> list[Span]:
    """Every innermost ``\\boxed{...}`` (one holding no other), nested braces balanced; an
    unclosed one is none. One pass over the braces with a stack of open boxes: linear, where
    balancing each box from its start read the text once per box. A box around another is
    left out: its content is the inner answer again, and reading every level of a deep nest
    would make the work quadratic once more."""
    starts = {m.end() - 1: m.start() for m in _BOXED_START_RE.finditer(text)}  # "{" -> start
    found: list[Span] = []
    open_boxes: list[list[int]] = []  # [start, content start, depth inside, holds a box]
    depth = 0
    for brace in _BRACE_RE.finditer(text):
        at = brace.start()
        if text[at] == "{":
            depth += 1
            if at in starts:
                if open_boxes:
                    open_boxes[-1][3] = 1
                open_boxes.append([starts[at], at + 1, depth, 0])
            continue
        if open_boxes and open_boxes[-1][2] == depth:
            start, content, _, holds_box = open_boxes.pop()
            if not holds_box:
                found.append((start, content, at))
        depth -= 1
    return found


def answer_spans(text: str) -> list[Span]:
    """Every answer marker's span (`#### N`, `<answer>`, `\\boxed{}`), in the text's order."""
    return sorted(hash_spans(text) + tag_spans(text) + boxed_spans(text))


def final_answer(text: str) -> tuple[str, Span] | None:
    """The last marker holding a number: that number, normalised, and its span. A `#### N`
    span ends where its number does (the rest of its line is not the answer, and a worked answer
    has little there); a tag's or box's ends at its close. The markers' contents do not overlap
    (see `boxed_spans`), so reading them all is linear too."""
    for start, content, end in reversed(answer_spans(text)):
        number = normalize_number(text[content:end])
        if number is None:
            continue
        if text.startswith(_HASH, start):
            at = _LEADERS_RE.match(text, content).end()  # type: ignore[union-attr]
            found = _NUMBER_RE.match(text, at, end)
            end = end if found is None else found.end()
        return number, (start, content, end)
    return None


def count_markers(text: str) -> int:
    """Answer markers the text holds: every `####` but headings (`answer_form.count_hash_markers`:
    `#### 6#####` is two), every `<answer>` and every innermost `\\boxed{}`."""
    return answer_form.count_hash_markers(text) + len(tag_spans(text)) + len(boxed_spans(text))


def extract_answer(text: str) -> str | None:
    """The model's final answer from the last ``#### N``, ``<answer>N</answer>`` or ``\\boxed{N}``.

    No "last number in the text" fallback: an explicit marker is the format signal. Whether the
    answer is a worked one is `reward`'s question (grpo.tasks.answer_form).
    """
    found = final_answer(text)
    return None if found is None else found[0]


def parse_gold(answer_field: str) -> str:
    """Normalised number after the ``####`` line of a GSM8K answer field."""
    matches = _GOLD_RE.findall(answer_field)
    number = normalize_number(matches[-1]) if matches else None
    if number is None:
        raise ValueError(f"no '#### <number>' in GSM8K answer field: {answer_field[-200:]!r}")
    return number


def _gold_number(gold_answer: str) -> str:
    """Accept either the raw GSM8K answer field or just the number."""
    gold_answer = str(gold_answer)
    if "####" in gold_answer:
        return parse_gold(gold_answer)
    number = normalize_number(gold_answer)
    if number is None:
        raise ValueError(f"gold answer has no number: {gold_answer!r}")
    return number


def _same_number(a: str, b: str) -> bool:
    return Decimal(a) == Decimal(b)


def is_correct(completion: str, gold_answer: str) -> bool:
    """Whether the completion is a worked answer (`reward`'s rules) whose number is the gold's."""
    return bool(reward(completion, {"answer": gold_answer})[1]["correct"])


def reward(completion: str, row: Row) -> tuple[float, dict]:
    """1.0 for a worked answer with the right number, FORMAT_REWARD for a worked answer with
    another, else 0.0; a worked answer has one marker, on its last line, after some working,
    and does not repeat itself (grpo.tasks.answer_form: answer spam earns nothing). The info
    gives the format and answer parts of the value (reward/format, reward/answer), the number
    read, how many markers the answer holds, and why a parseable answer was refused."""
    gold = _gold_number(row["answer"])
    found = final_answer(completion)
    pred, last = found if found is not None else (None, None)
    markers = count_markers(completion)
    refused = answer_form.refusal(completion, last, markers) or _not_arrived_at(
        completion, last, pred
    )
    formatted = refused is None
    correct = formatted and pred is not None and _same_number(pred, gold)
    info = {"pred": pred, "gold": gold, "markers": markers}
    if refused is not None and pred is not None:
        info["refused"] = refused
    return format_and_answer(formatted, correct, info)


def working_result(working: str) -> set[str]:
    """What the working arrives at, normalised: in its last sentence that holds a number, each
    number right after an "=" and the sentence's last number ("so 3 * 60 = 180 meters" arrives
    at 180, not at 3 or 60). Sentences end at a line's end or at ".", "!" or "?" before a blank
    (2.5 is one number). Linear: the sentences are split once and each is read once."""
    for sentence in reversed(_SENTENCE_END_RE.split(working)):
        plain = _plain(sentence)
        numbers = [m[0] for m in _NUMBER_RE.finditer(plain)]
        if numbers:
            results = [numbers[-1], *(m[1] for m in _RESULT_RE.finditer(plain))]
            return {n for r in results if (n := normalize_number(r)) is not None}
    return set()


def _not_arrived_at(text: str, last: Span | None, pred: str | None) -> str | None:
    """Why a worked answer's final number is not the working's result, or None: the CPU demo,
    once spam earned nothing, learned to end plausible working with an unrelated number (issue
    58). 99.2 % of GSM8K's own solutions (train and test) arrive at their answer so."""
    if last is None or pred is None or pred in working_result(text[: last[0]]):
        return None
    return "final number not in the working's last result"


def format_and_answer(formatted: bool, correct: bool, info: dict) -> tuple[float, dict]:
    """1.0 if correct, FORMAT_REWARD if only formatted, else 0.0; the info with both flags and
    the value's two parts, for GDPO (reward/format, reward/answer: grpo.core.episode.
    REWARD_COMPONENT_PREFIX)."""
    value = 1.0 if correct else FORMAT_REWARD if formatted else 0.0
    parts = {
        "reward/format": FORMAT_REWARD * formatted,
        "reward/answer": (1 - FORMAT_REWARD) * correct,
    }
    return value, {"formatted": formatted, "correct": correct, **info, **parts}


def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
    return question_messages(str(row["question"]), ANSWER_INSTRUCTION, system_prompt)


def load(source: str) -> list[Row]:
    """Load GSM8K rows; every row must have a question and an answer."""
    return load_rows_with(source, ("question", "answer"))


TASK = register_task(
    Task(
        name="gsm8k",
        load=load,
        build_messages=build_messages,
        reward=reward,
        instruction=ANSWER_INSTRUCTION,
        default_train="data/gsm8k/train.jsonl",
        count_markers=count_markers,
        default_test="data/gsm8k/test.jsonl",
    )
)
