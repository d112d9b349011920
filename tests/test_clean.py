"""`grpo clean RUN_DIR` (grpo/clean.py): the runs a rerun moved aside go, the newest --keep
stay, and nothing else beside them is touched (issue 64, items 6 and 8)."""

from __future__ import annotations

from pathlib import Path

from grpo.__main__ import main as grpo
from grpo.trainer.outputs import rotate_run_dir


def _run(path: Path, megabytes: int = 1) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text("name: demo\n")
    (path / "versions" / "v000001").mkdir(parents=True)
    (path / "versions" / "v000001" / "model.safetensors").write_bytes(b"w" * (megabytes << 20))
    return path


def test_clean_removes_the_runs_moved_aside_keeping_the_newest(tmp_path, capsys):
    out = tmp_path / "checkpoints"
    run = out / "demo"
    for n in range(4):  # four runs of one name: the real rotation numbers them
        rotate_run_dir(run)
        _run(run, megabytes=n + 1)  # demo.3 holds 1 MiB, demo.2 2, demo.1 3, demo 4
    assert sorted(p.name for p in out.iterdir()) == ["demo", "demo.1", "demo.2", "demo.3"]
    (out / "demo.9").mkdir()  # not a run: no config.yaml
    elsewhere = _run(tmp_path / "elsewhere")
    (out / "demo.10").symlink_to(elsewhere)
    _run(out / "demo.1.bak")
    _run(out / "demo_other.1")

    assert grpo(["clean", str(run), "--keep", "1", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "would remove" in said and (out / "demo.3").is_dir()

    assert grpo(["clean", str(run), "--keep", "1"]) == 0
    said = capsys.readouterr().out.splitlines()
    left = sorted(p.name for p in out.iterdir())
    assert left == ["demo", "demo.1", "demo.1.bak", "demo.10", "demo.9", "demo_other.1"], left
    assert (run / "config.yaml").is_file() and (elsewhere / "config.yaml").is_file()
    assert [line.split(" (")[0] for line in said if line.startswith("removed /")] == [
        f"removed {out / 'demo.2'}", f"removed {out / 'demo.3'}"
    ]  # fmt: skip
    assert said[-1] == f"removed 3.0 MiB in all; {run} itself is untouched", said
    assert any(line.startswith(f"left alone {out / 'demo.9'}") for line in said)


def test_clean_refuses_what_it_cannot_do(tmp_path, capsys):
    assert grpo(["clean", str(tmp_path / "no" / "such" / "run")]) == 2
    assert capsys.readouterr().err.startswith("clean: no such directory")
    assert grpo(["clean", str(tmp_path / "run"), "--keep", "-1"]) == 2


def test_the_newest_are_kept_by_number_not_by_name(tmp_path, capsys):
    """demo.10 is older than demo.2: the order is the rotation's numbers, not the names'."""
    run = tmp_path / "demo"
    for n in range(1, 12):
        _run(tmp_path / f"demo.{n}", megabytes=0)
    assert grpo(["clean", str(run), "--keep", "2"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.1", "demo.2"]


def test_what_is_freed_counts_no_file_twice_and_none_outside(tmp_path, capsys):
    """A run's `final` links to one of its versions, and a link may lead out of the run: what
    a link points at is not what removing the run frees."""
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"x" * (3 << 20))
    old = _run(tmp_path / "demo.1")
    (old / "final").symlink_to(old / "versions" / "v000001", target_is_directory=True)
    (old / "outside.bin").symlink_to(outside)
    assert grpo(["clean", str(tmp_path / "demo")]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1].startswith("removed 1.0 MiB in all;"), said
    assert outside.is_file()
