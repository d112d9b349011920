"""Build the GPU kit (issue 46): everything a run on the lent GPU machine needs that its image
lacks, in two parts that each travel with the working tree under the device's 64 MiB:

    python -m scripts.gpu_kit               # builds .gpu_kit/ (git-ignored)
    python -m scripts.gpu_kit --rehearse    # builds it, rehearses it on CPU, marks it rehearsed

    .gpu_kit/first/    wheels/ (DeepSpeed built here without ops, and the cp3xx manylinux wheels
                       of what the GPU image lacks: pyzmq, zstandard, gguf, pydantic, ...),
                       skeleton.tar.gz (the embedded model's config and tokenizer: the shape
                       of the random model the launch, speed and sync rows use), the first part
                       of the embedded model's GGUF (zstd), KIT.json
    .gpu_kit/second/   the rest of the GGUF, for the learning row (bench/gpu_kit.py second)

The GGUF (98 MB) cannot travel in one call: the first call leaves its part on the machine
(/tmp/grpo_kit), the second brings the rest while the machine is still warm. bench/gpu_kit.sh
runs there; docs/gpus.md says how to call it. The project itself travels as the working tree.

The rehearsal does on CPU what the GPU machine will do: the working tree as the device carries
it, copied alone; a fresh virtualenv holding only the GPU image's packages (at its versions
where this Python has them; torch is this machine's CPU build); the kit's wheels installed with
--no-index; both calls of bench/gpu_kit.sh with --smoke, every row required to pass. Only then
does the kit get its REHEARSED.json, without which bench/gpu_kit.sh refuses to run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / ".gpu_kit"
LIMIT_BYTES = 64 << 20  # what one call carries, the working tree included
MARGIN_BYTES = 1 << 20  # left free in each call: the tree grows between the build and the run
CACHE = Path(os.environ.get("GRPO_KIT_CACHE", Path.home() / ".cache" / "grpo-gpu-kit"))
# What the GPU image lacks (its package list: the device's KINDS.md), at the versions this
# project runs here. DeepSpeed is built from its sdist; the rest are downloaded as wheels.
CARRIED = ("pyzmq", "zstandard", "gguf", "hjson", "pydantic", "pydantic_core",
           "annotated_types", "typing_inspection", "blake3")  # fmt: skip
DEEPSPEED = "deepspeed"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
# The GPU image's packages that a run imports (its list: the device's KINDS.md), pinned to the
# image's versions where known; torch is this machine's CPU build, not the image's CUDA one.
DEVICE_PACKAGES = ("torch", "transformers==5.17.0", "huggingface_hub==1.33.0",
                   "tokenizers==0.23.2", "safetensors==0.8.0", "accelerate==1.15.0", "peft",
                   "numpy", "msgpack", "xxhash", "pyyaml", "tqdm", "matplotlib", "tensorboard",
                   "pyarrow", "psutil", "packaging", "einops", "ninja", "py-cpuinfo",
                   "sentencepiece", "jinja2")  # fmt: skip
SKELETON_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja")  # fmt: skip


class KitError(RuntimeError):
    """The kit cannot be built as asked; the message says why."""


def _run(cmd: list[str], **kw) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode:
        raise KitError(f"{' '.join(cmd[:6])} ... failed: {(done.stdout + done.stderr)[-1500:]}")


def pinned(name: str) -> str:
    return f"{name}=={importlib.metadata.version(name)}"


def download_wheels(dest: Path, python_version: str) -> list[Path]:
    """The manylinux wheels of CARRIED for that machine's Python, from the registry."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
          "--python-version", python_version, "--implementation", "cp", *platforms,
          "-d", str(dest), *(pinned(n) for n in CARRIED)])  # fmt: skip
    return sorted(dest.glob("*.whl"))


def deepspeed_wheel(dest: Path) -> Path:
    """DeepSpeed as a pure-Python wheel (DS_BUILD_OPS=0: its ops build just in time where
    they are used, and a ZeRO run uses none), built once from its sdist and cached."""
    spec = pinned(DEEPSPEED)
    version = spec.split("==")[1]
    cached = CACHE / f"deepspeed-{version}-py3-none-any.whl"
    if not cached.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  "--no-binary=:all:", "-d", tmp, spec])  # fmt: skip
            sdist = next(Path(tmp).glob("deepspeed-*.tar.gz"))
            _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                  "-w", tmp, str(sdist)], env={**os.environ, "DS_BUILD_OPS": "0"})  # fmt: skip
            built = next(Path(tmp).glob("deepspeed-*.whl"))
            shutil.copy(built, cached.with_suffix(".tmp"))
            os.replace(cached.with_suffix(".tmp"), cached)
    shutil.copy(cached, dest / cached.name)
    return dest / cached.name


def skeleton(dest: Path) -> Path:
    """The embedded model's config and tokenizer files (converting it once if needed)."""
    from grpo.models.convert import ensure_embedded_base

    base = ensure_embedded_base()
    out = dest / "skeleton.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for name in SKELETON_FILES:
            tar.add(base / name, arcname=name)
    return out


def gguf_compressed() -> tuple[bytes, str]:
    """The embedded GGUF, zstd-compressed, and the SHA-256 of the GGUF itself."""
    from grpo.models.embedded import embedded_gguf_path

    raw = embedded_gguf_path().read_bytes()
    return zstandard.ZstdCompressor(level=3).compress(raw), hashlib.sha256(raw).hexdigest()


def tree_files() -> list[str]:
    """What the device carries of the working tree in every call, relative to the repository:
    the tracked files and the untracked ones git does not ignore (no .venv, checkpoints, .git)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout  # fmt: skip
    return [rel for rel in listed.decode().split("\0") if rel and (REPO / rel).is_file()]


def tree_bytes() -> int:
    return sum((REPO / rel).stat().st_size for rel in tree_files())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def split_point(total: int, first_fixed: int, tree: int) -> int:
    """Where the compressed GGUF is cut: the same room left in each call. KitError when a
    call would carry more than LIMIT_BYTES - MARGIN_BYTES."""
    cut = max(0, min(total, (total - first_fixed) // 2))
    room = LIMIT_BYTES - MARGIN_BYTES - tree
    if first_fixed + cut > room or total - cut > room:
        raise KitError(
            f"the kit does not fit: the working tree {tree / 2**20:.1f} MiB, the first part "
            f"{(first_fixed + cut) / 2**20:.1f} MiB, the second {(total - cut) / 2**20:.1f} MiB; "
            f"each call carries at most {LIMIT_BYTES / 2**20:.0f} MiB with "
            f"{MARGIN_BYTES / 2**20:.0f} MiB to spare"
        )
    return cut


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return head + ("+dirty" if dirty else "")


def build(out: Path, python_version: str) -> dict:
    """The kit in `out` (replaced whole: written beside it, then renamed); returns KIT.json."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    first, second = tmp / "first", tmp / "second"
    (first / "wheels").mkdir(parents=True)
    second.mkdir()
    wheels = download_wheels(first / "wheels", python_version)
    wheels.append(deepspeed_wheel(first / "wheels"))
    skeleton(first)
    packed, sha = gguf_compressed()
    tree = tree_bytes()
    cut = split_point(len(packed), folder_bytes(first) + 4096, tree)  # 4096: KIT.json
    (first / "embedded.gguf.zst.part1").write_bytes(packed[:cut])
    (second / "embedded.gguf.zst.part2").write_bytes(packed[cut:])
    manifest = {
        "commit": commit(),
        "python_version": python_version,
        "wheels": sorted(w.name for w in wheels),
        "gguf_sha256": sha,
        "gguf_zst_bytes": len(packed),
        "tree_bytes": tree,
        "first_bytes": folder_bytes(first) + 4096,
        "second_bytes": folder_bytes(second),
        "limit_bytes": LIMIT_BYTES,
    }
    manifest["first_call_bytes"] = tree + manifest["first_bytes"]
    manifest["second_call_bytes"] = tree + manifest["second_bytes"]
    (first / "KIT.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.copy(first / "KIT.json", second / "KIT.json")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return manifest


def tree_copy(dest: Path) -> None:
    """The working tree as the device carries it (tree_files), into `dest`."""
    for rel in tree_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


def device_venv(dest: Path) -> Path:
    """A fresh virtualenv of this Python holding the GPU image's packages only."""
    _run([sys.executable, "-m", "venv", str(dest)])
    python = dest / "bin" / "python"
    links = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if Path(uv).is_file():
        cmd = [uv, "pip", "install", "-q", "--python", str(python)]
    else:
        cmd = [str(python), "-m", "pip", "install", "-q"]
    torch = f"torch=={importlib.metadata.version('torch').split('+')[0]}"  # this machine's build
    packages = [torch if p == "torch" else p for p in DEVICE_PACKAGES]
    _run([*cmd, *(["--find-links", links] if links else []), *packages])
    return python


def rehearse(kit: Path, work: Path) -> dict:
    """Rehearse `kit`'s commit on CPU in `work` (see the module's docstring); returns the
    rehearsal's record, also written as REHEARSED.json into `kit`'s parts. KitError on any
    failure, with the failing call's output."""
    t0 = time.monotonic()
    manifest = json.loads((kit / "first" / "KIT.json").read_text())
    for call in ("first", "second"):
        if manifest[f"{call}_call_bytes"] > LIMIT_BYTES:
            raise KitError(f"the {call} call would carry more than {LIMIT_BYTES >> 20} MiB")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    rehearsal_kit = build(work / "kit", version)  # this Python's wheels, the same commit
    if rehearsal_kit["commit"] != manifest["commit"]:
        raise KitError(f"the tree moved since the kit was built ({manifest['commit']} -> "
                       f"{rehearsal_kit['commit']}): build it again")  # fmt: skip
    tree = work / "tree"
    tree_copy(tree)
    python = device_venv(work / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(PYTHON=str(python), GRPO_KIT=str(work / "kit"), GRPO_KIT_STASH=str(work / "stash"),
               OUT=str(work / "out"), GRPO_KIT_UNREHEARSED="1",
               PATH=f"{python.parent}:{env.get('PATH', '')}")  # fmt: skip
    for call in ("first", "second"):
        done = subprocess.run(["bash", "bench/gpu_kit.sh", call, "--smoke"], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        if done.returncode:
            raise KitError(f"the rehearsal's {call} call exited {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-3000:]}")  # fmt: skip
    record = {
        "commit": manifest["commit"],
        "seconds": round(time.monotonic() - t0),
        "tables": [(work / "out" / f"gpu_kit_{c}.md").read_text() for c in ("first", "second")],
    }
    for call in ("first", "second"):
        (kit / call / "REHEARSED.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.gpu_kit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=KIT)
    parser.add_argument("--python-version", default="3.12",
                        help="the GPU machine's Python (its image: 3.12)")  # fmt: skip
    parser.add_argument("--rehearse", action="store_true",
                        help="then rehearse it on CPU and mark it rehearsed")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out.resolve(), args.python_version)
        if args.rehearse:
            with tempfile.TemporaryDirectory(prefix="gpu_kit_rehearsal_") as work:
                record = rehearse(args.out.resolve(), Path(work))
            print(f"rehearsed in {record['seconds']} s:\n\n" + "\n".join(record["tables"]))
    except KitError as e:
        print(f"gpu kit: {e}", file=sys.stderr)
        return 1
    mib = 2**20
    print(f"gpu kit for {manifest['commit']} in {args.out}: first call "
          f"{manifest['first_call_bytes'] / mib:.1f} MiB, second "
          f"{manifest['second_call_bytes'] / mib:.1f} MiB (limit {LIMIT_BYTES / mib:.0f} MiB, "
          "the working tree included)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
