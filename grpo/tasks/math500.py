"""MATH: competition problems (MATH-500) whose ``\\boxed{}`` answers math-verify checks.

The answer is the content of the completion's last ``\\boxed{...}``. `math-verify` parses it
and the row's ``answer`` field to SymPy and compares them, so equivalent forms count:
``0.5`` for ``\\frac{1}{2}``, ``\\frac{1}{\\sqrt2}`` for ``\\frac{\\sqrt{2}}{2}``, ``30`` for
``30^\\circ``, ``1, -2`` for ``-2, 1``, intervals, tuples, matrices and ``\\text{...}`` answers.

The check runs in a child process (one, started on first use and reused), with a timeout.
math-verify's own timeout is a SIGALRM, which works only in the main thread, and no signal
or thread can stop the hangs that matter most: SymPy evaluating ``10^{10^{10^{10}}}`` sits in
one C call and never returns to the interpreter. A child that does not answer within
`CHECK_TIMEOUT_S` is killed (the next check starts a new one) and the check raises, which
`grpo.tasks.score` records as a ``reward_error`` with reward 0. Any thread may call `reward`.
The child dies with its parent (`grpo.tasks.children`): a sampler or reward worker killed
during a hung check leaves no SymPy process behind.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from grpo.runtime.lifetime import die_with_parent

from . import answer_form, children
from .base import Row, Task, load_rows_with, question_messages, register_task
from .gsm8k import FORMAT_REWARD, boxed_spans, format_and_answer

__all__ = [
    "ANSWER_INSTRUCTION",
    "CHECK_TIMEOUT_S",
    "FORMAT_REWARD",
    "CheckerError",
    "build_messages",
    "check",
    "extract_boxed",
    "load",
    "reward",
]

ANSWER_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# Seconds one answer's parse and comparison may take in the child. A MATH-500 gold answer
# checks against itself in about 5 ms; math-verify's own default is 5 s.
CHECK_TIMEOUT_S = 5.0
# Seconds the child may take to start (importing SymPy and math-verify: ~1.5 s when idle).
STARTUP_TIMEOUT_S = 120.0
# Longest predicted answer kept in the reward info.
PRED_CHARS = 200


class CheckerError(RuntimeError):
    """math-verify raised, or its child process died, while checking an answer."""


def extract_boxed(text: str) -> str | None:
    """Content of the last non-empty innermost ``\\boxed{...}`` (nested braces balanced), else
    None. Linear in the text (`grpo.tasks.gsm8k.boxed_spans`): the contents do not overlap."""
    for _, start, end in sorted(boxed_spans(text), reverse=True):
        if content := text[start:end].strip():
            return content
    return None


# ---------------------------------------------------------------------------
# The check itself (runs in the child; in-process calls are for tests and tools)
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    from math_verify import parse

    return parse(f"\\boxed{{{gold}}}", parsing_timeout=None, raise_on_error=True)


def check(gold: str, pred: str) -> tuple[bool, bool]:
    """(parsed, correct) for a gold answer and a predicted one, both ``\\boxed{}`` contents.

    In-process and without a timeout: `reward` runs it in the child process. ``parsed`` is
    whether math-verify extracted anything from the prediction; errors propagate.
    """
    from math_verify import parse, verify

    target = parse(f"\\boxed{{{pred}}}", parsing_timeout=None, raise_on_error=True)
    if not target:
        return False, False
    correct = verify(_parse_gold(gold), target, timeout_seconds=None, raise_on_error=True)
    return True, bool(correct)


def _serve() -> None:
    """The child: one JSON request per stdin line, one JSON reply per line on the real stdout."""
    die_with_parent()  # a check hung in C never reads stdin again, so never sees its EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which closes stdin
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything a library prints goes to stderr, not into the replies
    sys.stdout = sys.stderr
    # Timeouts are the parent's job; math-verify warns once that its own are off.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (import before "ready": the parent times only checks)

    def send(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    send({"ready": True})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            parsed, correct = check(request["gold"], request["pred"])
            send({"parsed": parsed, "correct": correct})
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"[:1000]})


# ---------------------------------------------------------------------------
# The parent's side: a child process with a timeout
# ---------------------------------------------------------------------------


class _Checker:
    """The child process that runs `check`; restarted after a timeout or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._pid = os.getpid()

    def check(self, gold: str, pred: str, timeout: float) -> tuple[bool, bool]:
        with self._lock:
            try:
                proc = self._running()
                assert proc.stdin is not None
                proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
                proc.stdin.flush()
                reply = self._reply(proc, timeout, "check the answer")
            except BaseException:
                self._stop()  # a half-read reply or a busy child: start afresh next time
                raise
        if "error" in reply:
            raise CheckerError(f"math-verify: {reply['error']}")
        return bool(reply["parsed"]), bool(reply["correct"])

    def _running(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # a forked copy: the child belongs to the parent
            self._proc, self._buffer, self._pid = None, b"", os.getpid()
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        self._proc = children.start(
            [sys.executable, "-c", "from grpo.tasks.math500 import _serve; _serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._reply(self._proc, STARTUP_TIMEOUT_S, "start")
        return self._proc

    def _reply(self, proc: subprocess.Popen, timeout: float, what: str) -> dict[str, Any]:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        poller = select.poll()  # not select.select: a busy process may hold fds past 1024
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError(f"math-verify did not {what} within {timeout:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                try:
                    code = proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                raise CheckerError(f"math-verify's process closed its output (exit code {code})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _stop(self) -> None:
        proc, self._proc, self._buffer = self._proc, None, b""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._stop()


_CHECKER = _Checker()
atexit.register(_CHECKER.close)


# ---------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------


def reward(completion: str, row: Row) -> tuple[float, dict]:
    """1.0 if math-verify finds the answer's ``\\boxed{}`` equal to the gold one, FORMAT_REWARD
    for a wrong one, else 0.0, with its two parts for GDPO (reward/format, reward/answer, as
    GSM8K's). Only a worked answer is checked: one box, on its last line, after some working,
    no repetition (grpo.tasks.answer_form); the info says why another was refused. A checker
    error or timeout raises (see module doc)."""
    gold = str(row["answer"])
    boxes = boxed_spans(completion)
    filled = [box for box in boxes if completion[box[1] : box[2]].strip()]
    last = filled[-1] if filled else None
    pred = completion[last[1] : last[2]].strip() if last is not None else None
    refused = answer_form.refusal(completion, last, len(boxes))
    formatted = correct = False
    if pred is not None and refused is None:
        formatted, correct = _CHECKER.check(gold, pred, CHECK_TIMEOUT_S)
    if pred is not None and len(pred) > PRED_CHARS:
        pred = pred[:PRED_CHARS] + "..."
    info: dict[str, Any] = {"pred": pred, "gold": gold, "markers": len(boxes)}
    if refused is not None and pred is not None:
        info["refused"] = refused
    return format_and_answer(formatted, correct, info)


def count_boxes(text: str) -> int:
    """Answer markers an answer holds: its innermost ``\\boxed{}``s."""
    return len(boxed_spans(text))


def build_messages(row: Row, system_prompt: str) -> list[dict[str, str]]:
    return question_messages(str(row["problem"]), ANSWER_INSTRUCTION, system_prompt)


def load(source: str) -> list[Row]:
    """Load MATH rows; every row must have a problem and an answer."""
    return load_rows_with(source, ("problem", "answer"))


TASK = register_task(
    Task(
        name="math",
        load=load,
        build_messages=build_messages,
        reward=reward,
        instruction=ANSWER_INSTRUCTION,
        default_train="data/math500/train.jsonl",
        count_markers=count_boxes,
        default_test="data/math500/test.jsonl",
    )
)
