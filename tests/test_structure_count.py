"""The structure counts of issue 60 (scripts/structure_count.py) run on this tree: every place
they name is still defined, and the paths they follow reach what they claim to."""

from __future__ import annotations

from pathlib import Path

from scripts.structure_count import counts

REPO = Path(__file__).resolve().parent.parent


def test_the_counts_follow_a_version_and_a_step_through_this_tree() -> None:
    found = counts(REPO)
    stream, files = found["version_files_stream"], found["version_files_files"]
    assert "grpo/weights/stream/server.py" in stream and "grpo/weights/files.py" in files
    assert "grpo/weights/in_use.py" in stream and "grpo/trainer/loop.py" in files
    assert not any(f.startswith("grpo/sampler/") for f in stream + files)  # issue 60.1
    step = found["step_files"]
    assert "grpo/trainer/loop.py" in step and not any(f.startswith("grpo/algos/") for f in step)
    assert isinstance(found["fmt_skips"], int) and isinstance(found["lambdas"], int)
