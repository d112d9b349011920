"""Custom rewards for integration tests (loaded as ``tests.rewards_for_tests:<name>``)."""

from __future__ import annotations

import threading


def digit_fraction(completion: str, sample: dict) -> tuple[float, dict]:
    """Fraction of digit characters: a dense signal even for a tiny random model's gibberish."""
    score = sum(c.isdigit() for c in completion) / max(1, len(completion))
    return score, {"formatted": False, "correct": False, "length": len(completion)}


def always_raises(completion: str, sample: dict) -> float:
    """Exercises the error path of ``grpo.tasks.score``."""
    raise RuntimeError("boom")


def beyond_the_bound(completion: str, sample: dict) -> float:
    """A finite reward no advantage can hold (over grpo.core.columns.VALUE_LIMIT): the sampler
    scores it 0 with a reward_error."""
    return 1e39


def raises_on_every_fourth(completion: str, sample: dict) -> float:
    """Fails on a quarter of the answers (those whose length is a multiple of 4): a rate of
    failures under the default bound."""
    if len(completion) % 4 == 0:
        raise ValueError("no number in the answer")
    return 1.0


def takes_one_argument(completion: str) -> float:
    """A reward with the wrong signature: it cannot take the row grpo passes."""
    return float(len(completion))


def text_length(completion: str, sample: dict) -> tuple[float, dict]:
    """Longer answers score higher: varies across a random model's samples, so advantages are
    non-zero and the integration test's gradient steps really move the weights."""
    return min(len(completion), 200) / 200, {"formatted": False, "correct": False}


def flat_on_odd_questions(completion: str, sample: dict) -> tuple[float, dict]:
    """Every answer to a question of odd length scores the same: a flat group, which dynamic
    sampling must drop; other questions score by answer length."""
    if len(sample["question"]) % 2:
        return 0.5, {"formatted": False, "correct": False}
    return text_length(completion, sample)


def even_length_is_correct(completion: str, sample: dict) -> tuple[float, dict]:
    """'Correct' when the answer has an even number of characters: a random model's samples are
    right about half the time, so pass@k has something to count; formatted when it is long."""
    correct = len(completion) % 2 == 0
    return float(correct), {"formatted": len(completion) > 20, "correct": correct}


def slow_text_length(completion: str, sample: dict) -> tuple[float, dict]:
    """text_length, 50 ms a call: a batch of 16 answers takes a second to score, so a test's
    run lasts long enough for its sampler failures to be noticed before it ends."""
    import time

    time.sleep(0.05)
    return text_length(completion, sample)


def first_call_hangs(completion: str, sample: dict) -> tuple[float, dict]:
    """slow_text_length, except that the sampler's first call never returns: a hung reward,
    which reward.timeout_s must turn into one answer scored 0. The rewards run in worker
    processes, several per sampler and replaced after a timeout, so "first" is kept in a
    file named after the sampler (the workers' parent), which the first call creates."""
    import os
    import tempfile

    owner = os.environ.get("GRPO_PARENT_PID", str(os.getpid()))
    name = f"grpo-first-call-hangs-{owner}-{_started(owner)}"
    try:
        os.close(os.open(os.path.join(tempfile.gettempdir(), name), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return slow_text_length(completion, sample)
    threading.Event().wait()
    raise AssertionError("unreachable")


def _started(pid: str) -> str:
    """When process `pid` started (clock ticks since boot): with the pid, names one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return "0"


# ---------------------------------------------------------------------------------------------
# For grpo.tasks.runner's tests: rewards run in worker processes, so they are defined here (a
# worker imports them by name) and meet or hang through the file system, not threading objects.
# ---------------------------------------------------------------------------------------------


def length_reward(completion: str, sample: dict) -> tuple[float, dict]:
    """Later calls finish first (shorter sleeps), so arrival order differs from call order."""
    import time

    time.sleep(0.01 * sample["sleep"])
    return len(completion) / 10, {"index": sample["index"], "formatted": len(completion) > 3}


def _meet(sample: dict) -> None:
    """Return once `sample["n"]` calls are inside at the same time, each having put a file in
    `sample["dir"]`; RuntimeError after `sample["wait_s"]` (fewer ran at once)."""
    import os
    import time
    import uuid

    mine = os.path.join(sample["dir"], uuid.uuid4().hex)
    os.close(os.open(mine, os.O_CREAT | os.O_EXCL))
    deadline = time.monotonic() + sample["wait_s"]
    while len(os.listdir(sample["dir"])) < sample["n"]:
        if time.monotonic() > deadline:
            os.unlink(mine)  # gone with its call: a later call does not count it as inside
            raise RuntimeError(f"fewer than {sample['n']} calls ran at once")
        time.sleep(0.005)


def scripted(completion: str, sample: dict) -> tuple[float, dict]:
    """Does what the answer says: hang (asleep), regex (a catastrophic pattern that holds the GIL
    for good), spin (a pure-Python loop), crash (the process exits), exit (SystemExit), boom
    (an exception), nan, nap (0.75 s), meet (see _meet); anything else scores 1."""
    import os
    import re
    import time

    if completion == "hang":
        time.sleep(1e6)
    elif completion == "regex":
        re.match(r"(a+)+$", "a" * 64 + "!")  # 2^64 steps in one C call
    elif completion == "spin":
        while completion:
            pass
    elif completion == "crash":
        os._exit(7)
    elif completion == "exit":
        raise SystemExit(3)
    elif completion == "boom":
        raise RuntimeError("boom")
    elif completion == "nan":
        return float("nan"), {}
    elif completion == "nap":
        time.sleep(0.75)
    elif completion == "meet":
        _meet(sample)
    elif completion == "pid":
        with open(sample["pid_file"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(1e6)
    return 1.0, {"formatted": True}


def hangs_on_five(completion: str, sample: dict) -> tuple[float, dict]:
    """Length / 10, except that an answer of five characters never returns."""
    import time

    if len(completion) == 5:
        time.sleep(1e6)
    return len(completion) / 10, {"correct": sample["q"] == 7, "formatted": True}
