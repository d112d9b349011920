"""`python -m grpo TOOL ...`: the package's command-line tools (the workers have their own).

python -m grpo keys DIR          CURVE keys for the transport (grpo.wire.keys)
python -m grpo eval RUN_DIR      evaluate a run's saved versions (grpo.eval.cli)
"""

import sys

from grpo.eval import cli as eval_cli
from grpo.wire import keys

TOOLS = {"keys": keys.main, "eval": eval_cli.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(f"usage: python -m grpo {{{','.join(TOOLS)}}} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(TOOLS[sys.argv[1]](sys.argv[2:]))
