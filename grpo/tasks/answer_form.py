"""What makes an answer a worked answer and not answer spam: the rules the built-in rewards
(GSM8K, MATH) apply before they pay anything, and the repetition checks the run's degeneration
measures share (grpo.observe.degeneration).

A 135M model trained on "0.1 for any parseable `#### N`" learned to write `#### 2` twenty
times over (issue 58): every copy was a parseable answer. An answer earns credit here only when
- it holds exactly one answer marker (`count_markers`),
- that marker's line is its last non-empty line, holding the answer and nothing more,
- at least `MIN_WORKING_WORDS` words of working come before it, and
- it does not repeat itself (`repetition`: a line written `LINE_REPEATS` times, or a run of
  `NGRAM` pieces written `NGRAM_REPEATS` times).

Each check is a pure function of the text, linear in its length.
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

Span = tuple[int, int, int]  # (where the marker starts, where its content starts, ends)

MIN_WORKING_WORDS = 8  # words before the answer line: "18" alone, or "The answer is", is none
LINE_REPEATS = 3  # one line (of MIN_LINE_CHARS or more) this often: a loop, not working
MIN_LINE_CHARS = 4
NGRAM = 10  # pieces (words or runs of punctuation) in a repeated run
NGRAM_REPEATS = 3
MAX_TRAILING_CHARS = 12  # what may follow the answer on its line: "$", ".", " dollars"

_PIECE_RE = re.compile(r"\w+|[^\w\s]")
_WORD_RE = re.compile(r"\S+")
_HEADING_RE = re.compile(r"^[ \t]*####[ \t]+[^\d\s$+\-−.]", re.MULTILINE)  # "#### Step 2"
_CLOSERS_RE = re.compile(r"(?:\s|\\\]|\\\)|\$)*")  # a display's close after a box: "\n\\]"


def repeated_line(text: str) -> str | None:
    """A line (stripped, of `MIN_LINE_CHARS` or more) the text holds `LINE_REPEATS` times or
    more, else None."""
    lines = Counter(s for line in text.splitlines() if len(s := line.strip()) >= MIN_LINE_CHARS)
    line, count = lines.most_common(1)[0] if lines else ("", 0)
    return line if count >= LINE_REPEATS else None


def repeated_ngram(text: str) -> str | None:
    """A run of `NGRAM` pieces (words, and punctuation one character at a time) the text holds
    `NGRAM_REPEATS` times or more, as text, else None. Overlapping runs count: `#### 2` written
    five times holds its 10-piece runs three times or more."""
    pieces = _PIECE_RE.findall(text)
    runs = Counter(tuple(pieces[i : i + NGRAM]) for i in range(len(pieces) - NGRAM + 1))
    run, count = runs.most_common(1)[0] if runs else ((), 0)
    return " ".join(run) if count >= NGRAM_REPEATS else None


def repetition(text: str) -> str | None:
    """What the text repeats (a line, else a run of pieces), or None."""
    return repeated_line(text) or repeated_ngram(text)


def count_hash_markers(text: str) -> int:
    """How many `####` the text holds that are not a markdown heading (`#### Step 2`):
    `#### 6#####` and `######## 7` hold two each, as they would to a reader."""
    return text.count("####") - len(_HEADING_RE.findall(text))


def refusal(text: str, last: Span | None, markers: int) -> str | None:
    """Why `text` earns no credit although it may hold an answer, or None when it is a worked
    answer: `last`, the span of its final answer marker (None: it has none), `markers`, how
    many answer markers it holds in all (`count_markers` of its task)."""
    if last is None:
        return "no answer marker"
    if markers > 1:
        return f"{markers} answer markers"
    start, content, end = last
    line_end = text.find("\n", end)
    tail = text[end:] if line_end < 0 else text[end:line_end]
    after = "" if line_end < 0 else text[line_end:]
    if not _CLOSERS_RE.fullmatch(after) or len(tail.strip()) > MAX_TRAILING_CHARS:
        return "text after the answer"
    if len(_WORD_RE.findall(text[:start])) < MIN_WORKING_WORDS:
        return "no working before the answer"
    if repetition(text) is not None:
        return "repeats itself"
    return None


# An equation of plain numbers the working states: "a op b ... = c" (op + - * / x), read in a
# window of EQUATION_CHARS before each "=" (bounded work per "="), percentages left out.
EQUATION_CHARS = 80
_NUMBER = r"\d+(?:\.\d+)?"
_LEFT_RE = re.compile(rf"(?<![\d.])(?:{_NUMBER}[ \t]*[-+*/x×][ \t]*)+{_NUMBER}[ \t]*$")
_RIGHT_RE = re.compile(rf"[ \t]*(-?{_NUMBER})(?![\d%])")
_TOKEN_RE = re.compile(rf"{_NUMBER}|[-+*/x×]")


def equations(text: str) -> list[tuple[str, bool]]:
    """Each equation of plain numbers in `text`, as written, and whether its two sides agree
    (within rounding: 0.01, or a thousandth of the result). "48 - 6 = 32" is false: the
    arithmetic a worked answer shows, which no reward here checks (issue 58)."""
    plain = text.replace(",", "").replace("$", "")
    found = []
    for equals in re.finditer("=", plain):
        start = max(0, equals.start() - EQUATION_CHARS)
        left = _LEFT_RE.search(plain, start, equals.start())
        right = _RIGHT_RE.match(plain, equals.end())
        if left is None or right is None or (left.start() == start and start > 0):
            continue  # no plain equation, or one longer than the window
        value = _evaluate(_TOKEN_RE.findall(left.group(0)))
        if value is not None:
            result = Fraction(right.group(1))
            agree = abs(value - result) <= max(Fraction(1, 100), abs(result) / 1000)
            found.append((plain[left.start() : right.end()].strip(), agree))
    return found


def _evaluate(tokens: list[str]) -> Fraction | None:
    """numbers and operators, alternating, with * and / before + and -; None for a division by
    zero."""
    terms: list[Fraction] = [Fraction(tokens[0])]
    signs: list[int] = [1]
    for op, number in zip(tokens[1::2], tokens[2::2], strict=True):
        value = Fraction(number)
        if op in "*x×":
            terms[-1] *= value
        elif op == "/":
            if value == 0:
                return None
            terms[-1] /= value
        else:
            terms.append(value)
            signs.append(1 if op == "+" else -1)
    return sum((s * t for s, t in zip(signs, terms, strict=True)), Fraction(0))
