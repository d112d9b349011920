"""`grpo clean RUN_DIR [--keep N] [--dry-run]`: remove the runs that newer runs of the same name
moved aside (RUN_DIR.1, RUN_DIR.2, ...: grpo.trainer.outputs.rotate_run_dir never deletes one),
keeping the newest N of them (default 0). RUN_DIR itself is never touched. Each rerun of the
135M demo leaves 2-4 GB there (its versions and training state), so without this a machine
fills run by run.

Only a directory named exactly `<name>.<number>` beside RUN_DIR that holds a run's config.yaml
is removed; anything else of that name is listed as left alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

RUN_MARKER = "config.yaml"  # written by every run as it starts (grpo.trainer.outputs)


def moved_aside(run_dir: Path) -> list[Path]:
    """RUN_DIR's rotated predecessors, the newest (RUN_DIR.1) first."""
    numbered = []
    for p in run_dir.parent.glob(f"{run_dir.name}.*"):
        suffix = p.name[len(run_dir.name) + 1 :]
        if suffix.isdigit():
            numbered.append((int(suffix), p))
    return [p for _, p in sorted(numbered)]


def size_of(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _amount(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo clean", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run dir, e.g. checkpoints/cpu_demo")
    p.add_argument("--keep", type=int, default=0, help="rotated runs to keep, the newest")
    p.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    args = p.parse_args(argv)
    run_dir = args.run_dir.resolve()
    if args.keep < 0:
        print(f"clean: --keep must be >= 0, got {args.keep}", file=sys.stderr)
        return 2
    if not run_dir.parent.is_dir():
        print(f"clean: no such directory {run_dir.parent}", file=sys.stderr)
        return 2
    freed, said = 0, "would remove" if args.dry_run else "removed"
    for path in moved_aside(run_dir)[args.keep :]:
        if path.is_symlink() or not (path / RUN_MARKER).is_file():
            print(f"left alone {path}: not a run dir (no {RUN_MARKER})")
            continue
        size = size_of(path)
        if not args.dry_run:
            shutil.rmtree(path)
        freed += size
        print(f"{said} {path} ({_amount(size)})")
    print(f"{said} {_amount(freed)} in all; {run_dir} itself is untouched")
    return 0
