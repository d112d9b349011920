"""The GPU kit (issue 46): built to fit the device's 64 MiB a call, refused there unless
rehearsed, put back together only from its own parts, and rehearsed on CPU end to end (the
extended tier: a fresh virtualenv of the GPU image's packages, the kit's wheels with
--no-index, both calls of bench/gpu_kit.sh)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import zstandard

from bench.gpu_kit import Setup, assemble_gguf
from scripts.gpu_kit import LIMIT_BYTES, MARGIN_BYTES, KitError, build, rehearse, split_point

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20


def test_the_gguf_is_cut_so_that_each_call_fits_with_room_to_spare():
    tree, fixed, total = 8 * MIB, 15 * MIB, 89 * MIB
    cut = split_point(total, fixed, tree)
    first, second = tree + fixed + cut, tree + total - cut
    assert max(first, second) <= LIMIT_BYTES - MARGIN_BYTES
    assert abs(first - second) <= 1  # the same room left in each call
    with pytest.raises(KitError, match="does not fit"):
        split_point(110 * MIB, fixed, tree)  # a model that two calls cannot carry
    with pytest.raises(KitError, match="does not fit"):
        split_point(total, 45 * MIB, tree)  # wheels that leave the first call no room


def _kit(tmp_path: Path, rehearsed_commit: str | None) -> Path:
    kit = tmp_path / "kit"
    for call in ("first", "second"):
        (kit / call).mkdir(parents=True)
        (kit / call / "KIT.json").write_text(json.dumps({"commit": "abc"}))
        if rehearsed_commit is not None:
            (kit / call / "REHEARSED.json").write_text(json.dumps({"commit": rehearsed_commit}))
    return kit


@pytest.mark.parametrize("rehearsed", [None, "older"])
def test_a_kit_the_rehearsal_has_not_passed_is_refused_on_the_device(tmp_path, rehearsed):
    kit = _kit(tmp_path, rehearsed)
    env = {**os.environ, "GRPO_KIT": str(kit), "GRPO_KIT_STASH": str(tmp_path / "stash"),
           "OUT": str(tmp_path / "out")}  # fmt: skip
    env.pop("GRPO_KIT_UNREHEARSED", None)
    done = subprocess.run(["bash", "bench/gpu_kit.sh", "first"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "has not passed the CPU rehearsal" in done.stderr
    assert "has not passed" in (tmp_path / "out" / "gpu_kit_first.log").read_text()
    assert not (tmp_path / "stash" / "site").exists()  # nothing installed


def test_the_model_is_put_together_only_from_the_parts_of_one_kit(tmp_path):
    raw = os.urandom(1 << 16)
    packed = zstandard.ZstdCompressor().compress(raw)
    kit, stash = _kit(tmp_path, "abc"), tmp_path / "stash"
    stash.mkdir()
    (stash / "embedded.gguf.zst.part1").write_bytes(packed[:1000])
    (kit / "second" / "embedded.gguf.zst.part2").write_bytes(packed[1000:])
    setup = Setup(kit, stash, tmp_path / "out", smoke=True)
    (kit / "second" / "KIT.json").write_text(json.dumps({"gguf_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="not the kit's"):
        assemble_gguf(setup)
    sha = hashlib.sha256(raw).hexdigest()
    (kit / "second" / "KIT.json").write_text(json.dumps({"gguf_sha256": sha}))
    gguf = assemble_gguf(setup)
    assert gguf.read_bytes() == raw and (gguf.parent / "__init__.py").is_file()
    (stash / "embedded.gguf.zst.part1").unlink()  # the machine went back between the calls
    with pytest.raises(ValueError, match="run `bench/gpu_kit.sh first` first"):
        assemble_gguf(setup)


@pytest.mark.extended
def test_the_kit_fits_and_passes_its_rehearsal_on_cpu(tmp_path):
    """Builds the kit for the GPU image's Python, checks both calls against 64 MiB, and
    rehearses it (scripts.gpu_kit.rehearse): every row of both calls passes on CPU."""
    kit = tmp_path / "kit"
    manifest = build(kit, "3.12")
    assert manifest["first_call_bytes"] <= LIMIT_BYTES - MARGIN_BYTES
    assert manifest["second_call_bytes"] <= LIMIT_BYTES - MARGIN_BYTES
    record = rehearse(kit, tmp_path / "work")
    for call in ("first", "second"):
        assert (
            json.loads((kit / call / "REHEARSED.json").read_text())["commit"]
            == (manifest["commit"])
        )
    rows = [line for table in record["tables"] for line in table.splitlines()[4:]]
    names = [line.split("|")[1].strip() for line in rows]
    assert names == ["env", "launch_zero2", "launch_zero3", "speed", "sync", "convert",
                     "learning"]  # fmt: skip
    assert all(line.split("|")[3].strip() == "ok" for line in rows), rows
