"""Reward service entry point: `python reward_worker.py CONFIG [section.key=value ...]`."""

import sys

from grpo.cli import main
from grpo.runtime.lifetime import exit_now

if __name__ == "__main__":
    exit_now(main("reward", sys.argv[1:]))
