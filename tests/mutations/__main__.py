"""Apply each mutation to a copy of the checkout and check that its tests go red.

    .venv/bin/python -m tests.mutations                 every mutation
    .venv/bin/python -m tests.mutations NAME [NAME ...]  only these
    .venv/bin/python -m tests.mutations --list          names and items, nothing run

Each line says which tier's tests went red: "ci" (what CI runs) or "extended" (only with
--extended). Exit status 0 when every mutation run turned a CI-tier test red, 1 otherwise.
A mutation whose text no longer occurs exactly once is an error of the mutation, reported as
such.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutations import Mutation, in_ci_tier
from tests.mutations.catalogue import ALL

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"
# Large or generated directories the copy links to instead of copying: the converted
# embedded model is reused, the rest is not needed. The venv gets an overlay (`overlay_venv`).
# The converted embedded model, shared: the copy's own checkpoints/ holds its runs, so that a
# run dir resolves inside the copy (a link to the whole of checkpoints/ made every run dir
# resolve into the checkout, and a test comparing it with the copy's path red whatever the
# mutation).
LINKED = ("checkpoints/base",)
SKIPPED = (".git", "runs", "checkpoints", "__pycache__", ".pytest_cache", ".ruff_cache")


def apply(mutation: Mutation, root: Path) -> None:
    """Write the mutated file under `root`; raise ValueError if `old` is not there once."""
    path = root / mutation.path
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise ValueError(f"mutation {mutation.name}: its text occurs {count} times in "
                         f"{mutation.path}, not once")  # fmt: skip
    path.write_text(text.replace(mutation.old, mutation.new))


def copy_checkout(into: Path) -> Path:
    root = into / "repo"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(*SKIPPED, ".venv"),
                    symlinks=True)  # fmt: skip
    for name in LINKED:
        if (REPO / name).exists():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).symlink_to(REPO / name)
    if VENV.is_dir():
        overlay_venv(VENV, root)
    return root


def overlay_venv(source: Path, root: Path) -> None:
    """A venv at `root`/.venv that imports the copy's own `grpo` whatever the cwd, and through
    its installed commands, with every other package from `source`. A link to `source` would
    not do: its editable install maps `grpo` to the checkout by an import finder, so any process
    started outside the copy (a `cwd="/"` test, the `grpo` command) tested the unmutated code.
    `source`'s site-packages is put on the path as a plain directory, so its .pth files (the
    finder's among them) are never run."""
    venv = root / ".venv"
    subprocess.run([_base_python(source), "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (source_site,) = source.glob("lib/python*/site-packages")
    (site / "_mutation_copy.pth").write_text(f"{root}\n{source_site}\n")
    old, new = f"{source}/bin/python", f"{venv}/bin/python"
    for command in (source / "bin").iterdir():
        target = venv / "bin" / command.name
        if target.exists() or target.is_symlink():
            continue
        text = _script_text(command)
        if text is not None and old in text:
            target.write_text(text.replace(old, new))
            target.chmod(0o755)
        else:
            target.symlink_to(command)


def _base_python(venv: Path) -> str:
    """The interpreter `venv` was made from (its pyvenv.cfg's `home`)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return str(Path(value.strip()) / "python3")
    return sys._base_executable  # type: ignore[attr-defined]


def _script_text(path: Path) -> str | None:
    """A command's text if it is a script (it starts with "#!"), else None."""
    if path.is_symlink() or not path.is_file():
        return None
    with path.open("rb") as f:
        head = f.read(2)
    return path.read_text(errors="replace") if head == b"#!" else None


def pytest_red(root: Path, tests: list[str], extended: bool) -> tuple[bool, str]:
    """(some test failed, the tail of pytest's output) for `tests` run in `root`."""
    python = root / ".venv" / "bin" / "python"
    command = [str(python) if python.exists() else sys.executable, "-m", "pytest", "-q",
               "-n", "0", "-p", "no:cacheprovider", "-x", *(["--extended"] if extended else []),
               *tests]  # fmt: skip
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    # pytest: 1 = tests failed (what we want); 0 = all passed; 5 = none collected (all
    # deselected); anything else = the run broke
    return done.returncode == 1, (done.stdout + done.stderr)[-1500:]


def run(mutation: Mutation) -> tuple[str | None, str]:
    """(the tier whose tests went red, "ci" or "extended", or None; the tail of pytest's
    output) for one mutation, in a fresh copy: CI's tier first, then the extended one's."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        root = copy_checkout(Path(tmp))
        apply(mutation, root)
        ci = [t for t in mutation.tests if in_ci_tier(t)]
        red, tail = pytest_red(root, ci, extended=False) if ci else (False, "")
        if red:
            return "ci", tail
        rest = [t for t in mutation.tests if t not in ci]
        red, tail = pytest_red(root, rest, extended=True) if rest else (False, tail)
        return ("extended" if red else None), tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.names) - {m.name for m in ALL}
    if unknown:
        parser.error(f"no mutation named {', '.join(sorted(unknown))}")
    chosen = [m for m in ALL if not args.names or m.name in args.names]
    if args.list:
        for m in chosen:
            print(f"{m.name:40} item {m.item}")
        return 0
    survived, extended_only = [], []
    for m in chosen:
        start = time.monotonic()
        tier, tail = run(m)
        took = time.monotonic() - start
        print(f"{'GREEN' if tier is None else 'red  '} {tier or '-':8} {m.name:44} "
              f"item {m.item} ({took:.0f} s)", flush=True)  # fmt: skip
        if tier is None:
            survived.append(m.name)
            print(tail)
        elif tier != "ci":
            extended_only.append(m.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations turned their tests red; "
          f"{len(extended_only)} only in the extended tier {extended_only or ''}")  # fmt: skip
    return 1 if survived or extended_only else 0


if __name__ == "__main__":
    sys.exit(main())
