"""Trainer entry point, one process per rank (launch.sh starts it under torchrun / deepspeed):
`python training_worker.py CONFIG [section.key=value ...]`."""

import sys

from grpo.cli import main
from grpo.runtime.lifetime import exit_now

if __name__ == "__main__":
    exit_now(main("trainer", sys.argv[1:]))
