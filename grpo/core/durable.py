"""Files that survive a crash and a power loss: written whole or not at all, and on the disk
before anything that names them (a marker, LATEST, an acknowledgement) is written.

A rename is atomic, but neither the renamed file's data nor the rename itself is on the disk
until it is fsynced: the file before its rename, the directory after it. Without that, a power
loss can leave a marker naming files that were never written.
"""

from __future__ import annotations

import os
from pathlib import Path

# The file a complete training state holds, written last (grpo.trainer.state): a dir without it
# is a state that was being saved when the process died.
TRAIN_STATE_MARKER = "COMPLETE"


def train_state_dir(run_dir: Path) -> Path:
    """Where a run's training state is saved (and looked for before a resume)."""
    return run_dir / "train_state"


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries (the names created or renamed in it),
    to the disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file under `root`, then every directory bottom-up, `root` included. A file gone
    meanwhile was another process's temporary one: that process syncs what it became."""
    dirs = []
    for dirpath, _, filenames in os.walk(root):
        dirs.append(Path(dirpath))
        for name in filenames:
            try:
                fsync_path(Path(dirpath) / name)
            except FileNotFoundError:
                continue
    for d in reversed(dirs):
        fsync_path(d)


def write_atomic(path: Path, data: bytes | str) -> None:
    """`path` holds the old content or the new, never a part, and after a power loss too:
    the new content is fsynced before its rename and the rename before this returns."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def current_umask() -> int:
    """This process's umask, read without setting it where Linux tells it (/proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def as_umask_allows(root: Path) -> None:
    """Every file under `root` with the mode a new file gets under the user's umask (0644
    under 022). transformers writes a checkpoint's weights through a private temporary file,
    so they were readable by their owner alone: another user of the machine, or a sampler
    running as another user, could not read a published version (issue 64)."""
    mode = 0o666 & ~current_umask()
    for dirpath, _, names in os.walk(root):
        for name in names:
            os.chmod(Path(dirpath) / name, mode)
