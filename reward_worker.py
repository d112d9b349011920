"""Reward service entry point: `python reward_worker.py CONFIG [section.key=value ...]`."""

import sys

from grpo.cli import main

if __name__ == "__main__":
    sys.exit(main("reward", sys.argv[1:]))
