"""GSM8K: grade-school math word problems with a single numeric answer."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from .base import Row, Task, load_rows_with, question_messages, register_task

# Partial credit for an explicit, parseable answer marker: the early format signal that
# lets a small model learn *where* to put the answer before it learns to get it right.
FORMAT_REWARD = 0.1

ANSWER_INSTRUCTION = 'Give the final answer on its own line as "#### <number>".'

# Integer part with proper thousands groups ("1,234") or plain digits; optional decimals.
_NUM = r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(rf"(?P<num>{_NUM})(?:\s*/\s*(?P<den>{_NUM}))?")

# "#### N": the number must come first so markdown headings ("#### Step 2: ...") don't count.
_HASH_RE = re.compile(r"####[ \t]*(?=[ \t*$€£\\(]*[+\-−]?\.?\d)([^\n]*)")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED_START_RE = re.compile(r"\\boxed\s*\{")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_GOLD_RE = re.compile(r"####[ \t]*([^\n]*)")

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


def normalize_number(s: str) -> str | None:
    """First number in ``s`` as a canonical string ("1,234.50 dollars" -> "1234.5")."""
    text = _FRAC_RE.sub(r"\1/\2", s.strip())
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    m = _NUMBER_RE.search(text)
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


def _boxed_contents(text: str) -> list[tuple[int, str]]:
    """(position, content) of every ``\\boxed{...}``, with nested braces balanced."""
    found = []
    for m in _BOXED_START_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append((m.start(), text[m.end() : i - 1]))
    return found


def extract_answer(text: str) -> str | None:
    """The model's final answer from the last ``#### N``, ``<answer>N</answer>`` or ``\\boxed{N}``.

    No "last number in the text" fallback: an explicit marker is the format signal.
    """
    candidates = [(m.start(), m[1]) for m in _HASH_RE.finditer(text)]
    candidates += [(m.start(), m[1]) for m in _TAG_RE.finditer(text)]
    candidates += _boxed_contents(text)
    for _, content in sorted(candidates, reverse=True):
        number = normalize_number(content)
        if number is not None:
            return number
    return None


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
    pred = extract_answer(completion)
    return pred is not None and _same_number(pred, _gold_number(gold_answer))


def reward(completion: str, row: Row) -> tuple[float, dict]:
    """1.0 if correct, FORMAT_REWARD for a parseable but wrong answer, else 0.0."""
    gold = _gold_number(row["answer"])
    pred = extract_answer(completion)
    formatted = pred is not None
    correct = formatted and _same_number(pred, gold)
    value = 1.0 if correct else FORMAT_REWARD if formatted else 0.0
    return value, {"formatted": formatted, "correct": correct, "pred": pred, "gold": gold}


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
        default_train="data/gsm8k/train.jsonl",
        default_test="data/gsm8k/test.jsonl",
    )
)
