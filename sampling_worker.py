"""Sampler entry point: `python sampling_worker.py CONFIG [section.key=value ...]`."""

import sys

from grpo.cli import main

if __name__ == "__main__":  # the guard matters: rollout engines may spawn child processes
    sys.exit(main("sampler", sys.argv[1:]))
