"""`python -m grpo TOOL ...`: the package's command-line tools (the workers have their own).

python -m grpo keys DIR          CURVE keys for the transport (grpo.wire.keys)
python -m grpo eval RUN_DIR      evaluate a run's saved versions (grpo.eval.cli)
python -m grpo samples RUN_DIR   print the newest answers a run wrote (grpo.observe.samples)
python -m grpo merge-lora A OUT  fold a LoRA version into its base model (grpo.models.merge)
python -m grpo check CONFIG      look up every name the config picks (grpo.plan)
python -m grpo launch-env CONFIG check the config; print the GPUs and values launch.sh needs
"""

import sys

from grpo.core.registry import load_object
from grpo.runtime.lifetime import exit_now

# Imported only when chosen: `keys` should not pay for torch.
TOOLS = {
    "keys": "grpo.wire.keys:main",
    "eval": "grpo.eval.cli:main",
    "samples": "grpo.observe.samples:main",
    "merge-lora": "grpo.models.merge:main",
    "check": "grpo.plan:main",
    "launch-env": "grpo.cli:launch_env",
}

if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(f"usage: python -m grpo {{{','.join(TOOLS)}}} ... (--help: what each does)",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    exit_now(load_object(TOOLS[sys.argv[1]], "tool")(sys.argv[2:]))
