"""Apply each mutation to a copy of the checkout and check that its tests go red.

    .venv/bin/python -m tests.mutations                 every mutation
    .venv/bin/python -m tests.mutations NAME [NAME ...]  only these
    .venv/bin/python -m tests.mutations --list          names and items, nothing run

Exit status 0 when every mutation run turned its tests red, 1 otherwise. A mutation whose text
no longer occurs exactly once is an error of the mutation, reported as such.
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

from tests.mutations import Mutation
from tests.mutations.catalogue import ALL

REPO = Path(__file__).resolve().parents[2]
# Large or generated directories the copy links to instead of copying: the converted
# embedded model is reused, the rest is not needed.
LINKED = ("checkpoints", ".venv")
SKIPPED = (".git", "runs", "__pycache__", ".pytest_cache", ".ruff_cache")


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
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(*SKIPPED, *LINKED), symlinks=True)
    for name in LINKED:
        if (REPO / name).exists():
            (root / name).symlink_to(REPO / name)
    return root


def run(mutation: Mutation) -> tuple[bool, str]:
    """(went red, the tail of pytest's output) for one mutation, in a fresh copy."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        root = copy_checkout(Path(tmp))
        apply(mutation, root)
        # --extended: a mutation's tests may be in the extended tier (tests/conftest.py)
        command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                   "--extended", "-x", *mutation.tests]  # fmt: skip
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        # pytest: 1 = tests failed (what we want); 0 = all passed; anything else = the run broke
        return done.returncode == 1, (done.stdout + done.stderr)[-1500:]


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
    survived = []
    for m in chosen:
        start = time.monotonic()
        red, tail = run(m)
        took = time.monotonic() - start
        print(f"{'red  ' if red else 'GREEN'} {m.name:40} item {m.item} ({took:.0f} s)",
              flush=True)  # fmt: skip
        if not red:
            survived.append(m.name)
            print(tail)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutations turned their tests red")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
