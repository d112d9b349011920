"""Start this node's trainer ranks: `python -m grpo.trainer.launch CONFIG [overrides]`.

One command line on CPU and GPU: torchrun with the config's nodes, ranks and rendezvous
address runs `training_worker.py CONFIG [overrides]` once per rank. Only the device differs,
and the ranks find it themselves (DeepSpeed's accelerator and nccl or gloo: grpo.cli and
grpo.trainer). torchrun passes each rank its place in environment variables (RANK,
LOCAL_RANK, WORLD_SIZE), never as arguments, so the worker's own arguments stay as given
(the DeepSpeed launcher's `--local_rank=N` in front of them is what broke the GPU path once).

When the sampler fails or the user presses Ctrl-C, launch.sh sends SIGTERM to the trainer's
process group; torchrun then raises SignalException and prints a long traceback that buries
the one line saying why the run stopped, so that one is turned into a line.

One rank on one node has nobody to meet: this process becomes that rank (exec) with the
variables torchrun would have set. torchrun's own start-up (torch imported once more, about a
second before the rank starts and 2-3 s of CPU) and shutdown buy nothing there.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo.config import Config, ConfigError, load_config
from grpo.runtime.lifetime import PARENT_ENV, die_with_parent, exit_now

WORKER = "training_worker.py"
INPUT_ERROR = "trainer: "  # opens the line of a rank's input error (told_torchrun)


def torchrun_argv(cfg: Config, worker_args: list[str]) -> list[str]:
    """torchrun's arguments for this node's ranks; the same whatever the device."""
    t = cfg.train
    return [
        "--nnodes", str(t.nnodes), "--node_rank", str(t.node_rank),
        "--nproc_per_node", str(t.num_ranks),
        "--master_addr", t.master_addr, "--master_port", str(t.master_port),
        WORKER, *worker_args,
    ]  # fmt: skip


def single_rank_env(cfg: Config) -> dict[str, str] | None:
    """The variables torchrun gives a rank, when this node runs the whole trainer as one rank
    (then it runs without torchrun); None when torchrun must start the ranks. No master
    address or port: a world of one rank is formed in its own process (join_trainer_world)."""
    t = cfg.train
    if t.nnodes != 1 or t.num_ranks != 1:
        return None
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}


def main(argv: list[str]) -> int:
    try:
        cfg = load_config(argv[0] if argv else None, argv[1:])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    die_with_parent()
    # The node's cores split between its ranks unless set: more threads would oversubscribe.
    threads = max(1, (os.cpu_count() or 1) // cfg.train.num_ranks)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if (env := single_rank_env(cfg)) is not None:
        os.environ.update(env)
        os.execv(sys.executable, [sys.executable, "-u", WORKER, *argv])

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # torchrun puts each rank in a session of its own: without this, a SIGKILL of this
    # process (kill -9, the OOM killer) would leave the ranks running, holding the ports.
    os.environ[PARENT_ENV] = str(os.getpid())
    # The ranks say why they fail; torchrun's agent would add a dozen lines and a box per
    # failure (its `main` wraps `run` in an error recorder that prints one).
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(torchrun_argv(cfg, argv)))
    except SignalException as e:
        print(f"trainer: stopped by {e.sigval.name}", file=sys.stderr)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        code, line = failed_ranks(e.failures)
        if line:
            print(line, file=sys.stderr)
        return code
    return 0


def failed_ranks(failures: Mapping[int, Any]) -> tuple[int, str]:
    """This node's exit code and lines for its ranks' failures (torchrun's ProcessFailure by
    global rank, each with an `exitcode`, negative for a signal, and the `message` a rank left
    in its error file). A rank's 2 (its input is wrong: grpo.cli.exit_code_for) stays 2
    whatever the others did, so launch.sh does not restart a trainer that would fail the same
    way, and its line is said once however many ranks found it (`told_torchrun`). Anything
    else is 1, the run's failure, named by rank (the rank logged why)."""
    codes = {rank: failure.exitcode for rank, failure in sorted(failures.items())}
    if 2 in codes.values():
        told = {failures[r].message for r, c in codes.items() if c == 2}
        lines = sorted(m for m in told if isinstance(m, str) and m.startswith(INPUT_ERROR))
        return 2, "\n".join(lines) or "trainer: a rank could not start (exit 2)"
    said = ", ".join(
        f"rank {r} {'killed by signal ' + str(-c) if c < 0 else f'exit {c}'}"
        for r, c in codes.items()
    )
    return 1, f"trainer: {said} (the rank's lines above say why)"


def told_torchrun(line: str) -> bool:
    """Under a torchrun of several ranks, leave a rank's input error in torchrun's error file
    (TORCHELASTIC_ERROR_FILE, one per rank) for this node's launcher to say once
    (`failed_ranks`), where every rank would log the same line; False where nobody reads it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    body = {"message": f"{INPUT_ERROR}{line}", "timestamp": int(time.time())}
    Path(path).write_text(json.dumps(body))
    return True


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
