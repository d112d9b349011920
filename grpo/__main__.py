"""`grpo TOOL ...` (installed: `pip install -e .`, which scripts/setup.sh does) or `python -m grpo
TOOL ...`: the package's command-line tools (the workers have their own).

grpo launch CONFIG [k=v ...]     start a run: launch.sh with this Python (ROLE=... as there)
grpo check CONFIG                check the config and what the run will open (grpo.plan)
grpo eval RUN_DIR|MODEL          evaluate a run's saved versions, or any model (grpo.eval_cli)
grpo samples RUN_DIR             print the newest answers a run wrote (grpo.observe.samples)
grpo merge-lora ADAPTER OUT      fold a LoRA version into its base model (grpo.models.merge)
grpo clean RUN_DIR               remove the runs a rerun of RUN_DIR moved aside (grpo.clean)
grpo keys DIR                    CURVE keys for the transport (grpo.wire.keys)
grpo launch-env CONFIG           check the config; print the GPUs and values launch.sh needs

A failure is one line and exit 2; `grpo --debug launch ...` (GRPO_DEBUG=1) adds a role's traceback.
"""

import difflib
import os
import sys
from typing import NoReturn

from grpo.core.paths import REPO_ROOT
from grpo.core.registry import load_object
from grpo.runtime.lifetime import exit_now

# Imported only when chosen: `keys` should not pay for torch.
TOOLS = {
    "keys": "grpo.wire.keys:main",
    "eval": "grpo.eval_cli:main",
    "samples": "grpo.observe.samples:main",
    "merge-lora": "grpo.models.merge:main",
    "clean": "grpo.clean:main",
    "check": "grpo.plan:main",
    "launch-env": "grpo.cli:launch_env",
}


def launch(argv: list[str]) -> NoReturn:
    """launch.sh with the arguments, run by this interpreter's environment (PYTHON), from where
    the user stands (its relative paths are theirs: grpo/core/paths.py)."""
    script = REPO_ROOT / "launch.sh"
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    os.execvpe("bash", ["bash", str(script), *argv], env)  # replaces this process


def unknown_tool(name: str | None) -> str:
    """The line for a missing or mistyped tool name, with the nearest tool when one is close."""
    tools = ["launch", *TOOLS]
    usage = f"usage: grpo {{{','.join(tools)}}} ... (--help: what each does)"
    if name is None:
        return usage
    close = difflib.get_close_matches(name, tools, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"grpo: no tool {name!r}{hint}; {usage}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:  # a failure's traceback too, in this process and the roles it starts
        argv.remove("--debug")
        os.environ["GRPO_DEBUG"] = "1"
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "launch":
        launch(argv[1:])
    if not argv or argv[0] not in TOOLS:
        print(unknown_tool(argv[0] if argv else None), file=sys.stderr)
        return 2
    return load_object(TOOLS[argv[0]], "tool")(argv[1:])


if __name__ == "__main__":
    exit_now(main())
