"""The suite's own machinery: what pyproject.toml's addopts rely on still does its job."""

import os
import subprocess

from tests.conftest import PYTHON, REPO

GROUPED_TESTS = """
import os
import pytest

@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    with open(os.path.join(os.environ["RAN_DIR"], f"ran_{i}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path):
    """The embedded-model tests take turns on one worker and each module's engine or straight
    run is set up once only if --dist loadgroup groups them; a pytest that breaks it does so
    silently (pytest-dev/pytest-xdist#1386), spreading the tests over both workers."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_grouped.py").write_text(GROUPED_TESTS)
    (tmp_path / "t" / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run(
        [PYTHON, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "t"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAN_DIR": str(tmp_path), "PYTEST_ADDOPTS": ""},  # not the outer run's
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = {(tmp_path / f"ran_{i}").read_text() for i in range(6)}
    assert len(workers) == 1, f"one group ran on {sorted(workers)}"


MUST_RUN = """
import pytest

@pytest.mark.must_run_in_ci
def test_needs_a_second_host():
    pytest.skip("no second interface")

def test_may_skip():
    pytest.skip("optional here")
"""


def test_a_skip_ci_must_not_have_fails_under_ci_and_every_skip_is_printed(tmp_path):
    """Under CI=true a skip of a `must_run_in_ci` test fails the run with its reason; other
    skips, and every skip outside CI, are listed with their reasons (-rfEs)."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_skips.py").write_text(MUST_RUN)
    (tmp_path / "t" / "pytest.ini").write_text("[pytest]\naddopts = -rfEs -p tests.ci_skips\n")
    env = {**os.environ, "PYTEST_ADDOPTS": "", "PYTHONPATH": str(REPO)}
    runs = {}
    for ci in ("true", ""):
        runs[ci] = subprocess.run(
            [PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "t"], cwd=tmp_path,
            capture_output=True, text=True, timeout=120, env={**env, "CI": ci},
        )  # fmt: skip
    under_ci, elsewhere = runs["true"], runs[""]
    assert under_ci.returncode == 1, under_ci.stdout[-2000:]
    assert "skipped under CI=true, where this test must run: no second interface" in (
        under_ci.stdout
    ), under_ci.stdout[-2000:]
    assert "SKIPPED [1] t/test_skips.py" in under_ci.stdout and "optional here" in under_ci.stdout
    assert elsewhere.returncode == 0, elsewhere.stdout[-2000:]
    assert "no second interface" in elsewhere.stdout and "optional here" in elsewhere.stdout


def test_the_extended_tier_runs_only_when_asked():
    """tests/conftest.py deselects the tests marked `extended` (CI's default run leaves them
    out) and keeps them with --extended; the other tests of a module run either way."""

    def collected(*extra: str) -> list[str]:
        proc = subprocess.run(
            [PYTHON, "-m", "pytest", "-q", "--collect-only", "-n", "0", "-p", "no:cacheprovider",
             *extra, "tests/test_chaos.py"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return [line for line in proc.stdout.splitlines() if "::" in line]

    crash = "test_a_sigkilled_trainer_then_sampler_resume_and_train_every_batch_exactly_once"
    default, extended = collected(), collected("--extended")
    assert f"tests/test_chaos.py::{crash}[collective]" in default
    assert f"tests/test_chaos.py::{crash}[stream]" not in default
    assert set(default) < set(extended) and f"tests/test_chaos.py::{crash}[stream]" in extended
