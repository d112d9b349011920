"""A pytest plugin: tests marked `must_run_in_ci` fail instead of skipping when CI=true.

Some tests skip for a reason a developer's machine may have (no root for network namespaces,
no second interface, vLLM not installed) but CI's must not: there a skip would hide that the
only test of a property (CURVE between two hosts, the vLLM engine) did not run. The suite
prints every skip with its reason (`-rfEs` in pyproject.toml), and under CI=true a skip of
such a test is reported as a failure naming the reason."""

from __future__ import annotations

import os

import pytest

MARKER = "must_run_in_ci"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a skip of this test fails the run when CI=true (tests/ci_skips.py)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") == "true" and item.get_closest_marker(MARKER):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where this test must run: {reason}"
