"""`python -m grpo keys DIR`: the package's command-line tools (the workers have their own)."""

import sys

from grpo.wire import keys

TOOLS = {"keys": keys.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        print(f"usage: python -m grpo {{{','.join(TOOLS)}}} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(TOOLS[sys.argv[1]](sys.argv[2:]))
