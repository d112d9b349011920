"""The trainer's process: joins the ranks' world, runs the Trainer, and turns how it ended into
an exit code and one line naming the cause."""

from __future__ import annotations

import logging
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist

from grpo.config import Config
from grpo.runtime.progress import ACTIVITY, STARTING
from grpo.trainer.launch import told_torchrun
from grpo.trainer.loop import Trainer
from grpo.trainer.ranks import collective_failure, collective_timeout_s
from grpo.wire import messages
from grpo.wire.channels import PeerError

log = logging.getLogger("grpo.trainer")


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def without_deepspeed_shm_op() -> None:
    """On CPU, DeepSpeed's init_distributed JIT-compiles a shared-memory all-reduce op with g++
    and ninja (about 40 s on a fresh install, and a rebuild whenever another virtualenv built
    it last; every rank start runs ninja and waits on its lock). Only DeepSpeed's inference
    all-reduce uses it; training's collectives go through gloo. Marking it incompatible, in
    the dict DeepSpeed keeps for that, means it is never built."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def join_trainer_world(backend: str, timeout: timedelta) -> None:
    """This rank's process group, through DeepSpeed. A world of one rank is formed first over
    an in-process store, and DeepSpeed keeps it: the env:// rendezvous would listen on
    train.master_port, a port picked before the launch that another program can take
    meanwhile (EADDRINUSE), and a world of one has nobody to meet there."""
    import deepspeed
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)


def _interrupted() -> int:
    """Exit 130 for a SIGTERM or Ctrl-C, said only once the trainer got past its start: a
    starting one was stopped by whoever says why (launch.sh for Ctrl-C or a failed role,
    torchrun for another rank's failure, grpo.trainer.launch.failed_ranks)."""
    starting = ACTIVITY.snapshot().phase == STARTING
    log.log(logging.DEBUG if starting else logging.ERROR, "trainer stopping: interrupted")
    return 130


def peer_error_exit(error: PeerError) -> int:
    """2 when the samplers stopped because of the run's input (their reward failing: a restart
    would score the same answers with the same function, so launch.sh must not restart the
    trainer either); else 1."""
    return 2 if messages.INPUT_STOPPED in str(error) else 1


def run_trainer(cfg: Config) -> int:
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout_s = collective_timeout_s(cfg.transport)
    try:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        else:
            without_deepspeed_shm_op()
        join_trainer_world(backend, timedelta(seconds=timeout_s))
    except KeyboardInterrupt:
        return _interrupted()
    try:
        Trainer(cfg).run()
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except PeerError as e:
        code = peer_error_exit(e)
        if code != 2 or not told_torchrun(f"stopping: {e}"):  # several ranks: said once
            log.error("trainer stopping: %s", e)
        return code
    except RuntimeError as e:
        failure = collective_failure(e, dist.get_rank(), timeout_s)
        if failure is None:
            raise
        log.error("trainer stopping: %s", failure)
        return 1
    finally:
        dist.destroy_process_group()
