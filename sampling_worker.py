"""Sampler entry point: `python sampling_worker.py CONFIG [section.key=value ...]`."""

import sys

from grpo.cli import main
from grpo.runtime.lifetime import exit_now

if __name__ == "__main__":  # the guard matters: rollout engines may spawn child processes
    exit_now(main("sampler", sys.argv[1:]))
