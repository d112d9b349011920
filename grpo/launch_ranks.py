"""`torchrun` for launch.sh, minus the traceback it prints when it is stopped on purpose.

When the sampler fails or the user presses Ctrl-C, launch.sh sends SIGTERM to the trainer's
process group; torchrun then raises SignalException and prints a long traceback that buries
the one line saying why the run stopped.
"""

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as e:
        print(f"trainer: stopped by {e.sigval.name}", file=sys.stderr)
        sys.exit(128 + int(e.sigval))
