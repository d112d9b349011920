"""The reviewer's mutation script (`python -m tests.mutations`) stays usable: every mutation
applies to the code as it is now and names tests that exist. Running them is slow and is left
to the script."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.mutations import in_ci_tier
from tests.mutations.__main__ import apply, copy_checkout, pytest_red, run
from tests.mutations.catalogue import ALL


def test_names_are_unique() -> None:
    names = [m.name for m in ALL]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutation", ALL, ids=lambda m: m.name)
def test_mutation_applies_and_names_existing_tests(tmp_path, mutation) -> None:
    target = tmp_path / mutation.path
    target.parent.mkdir(parents=True, exist_ok=True)  # a file at the root: tmp_path itself
    target.write_text((REPO / mutation.path).read_text())
    apply(mutation, tmp_path)
    assert target.read_text() != (REPO / mutation.path).read_text()
    for node in mutation.tests:
        path, _, name = node.partition("::")
        source = (REPO / path).read_text()
        assert f"def {name.split('[')[0].split('::')[-1]}(" in source, node


@pytest.mark.parametrize("mutation", ALL, ids=lambda m: m.name)
def test_every_mutation_names_a_test_ci_runs(mutation) -> None:
    """No guarantee rests on the extended tier alone: CI's run must be able to catch it."""
    assert any(in_ci_tier(node) for node in mutation.tests), mutation.tests


def test_the_tier_of_a_test_is_read_from_its_marks() -> None:
    assert in_ci_tier("tests/test_mutations.py::test_names_are_unique")
    assert not in_ci_tier("tests/test_mixtures.py::test_a_run_on_a_gsm8k_and_math500_mixture")


def test_the_runner_tests_the_code_it_mutated_from_any_directory() -> None:
    """The copy's processes import the copy, not the checkout, whatever their cwd and through
    the installed `grpo` command: a mutation that only a `cwd="/"` test reaches turns red (with
    a link to the checkout's venv, whose editable install maps `grpo` to the checkout, it
    stayed green)."""
    (mutation,) = [m for m in ALL if m.name == "help_fails_outside_the_checkout"]
    tier, tail = run(mutation)
    assert tier == "ci", tail


def test_a_copy_s_run_dirs_resolve_inside_the_copy(tmp_path) -> None:
    """The copy shares only the converted embedded model with the checkout: with the whole of
    checkpoints/ linked, every run dir resolved into the checkout, and a test that compares
    `launch-env`'s RUN_DIR with the copy's path went red under every mutation (a false red)."""
    root = copy_checkout(tmp_path)
    assert not (root / "checkpoints").is_symlink()
    assert (root / "checkpoints" / "cpu_demo").resolve().is_relative_to(root.resolve())
    placement = "tests/test_launch_path.py::test_placement_command_for_launch_sh"
    red, tail = pytest_red(root, [placement], extended=False)
    assert not red, tail
