"""The workers' shared command line: config + overrides in, one clear line out on bad input."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import warnings

from grpo.config import ConfigError, describe, load_config
from grpo.config.rules import serves_teacher
from grpo.plan import check_names
from grpo.preflight import preflight
from grpo.runtime.host_memory import keep_freed_memory
from grpo.runtime.lifetime import die_with_parent
from grpo.runtime.placement import placement_for, visible_gpus
from grpo.runtime.progress import ACTIVITY, STARTING
from grpo.tasks.failures import RewardFailingError
from grpo.trainer.launch import told_torchrun

USAGE = """usage: {prog} CONFIG.yaml [section.key=value ...] [--resume]
  e.g. {prog} configs/cpu_demo.yaml train.total_steps=2 rollout.max_new_tokens=64
  --resume      continue the run from its saved state and spool (train.resume=always)
  --help-keys   list every config key with its default and meaning"""


def setup_logging(role: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    tag = f"{role} r{rank}" if role == "trainer" else role
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [{tag}] %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("DeepSpeed", "deepspeed", "transformers", "httpx", "urllib3", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Weight-loading progress bars and a deprecation inside DeepSpeed's ZeRO all-gather are noise
    # in a run log; a step is one line of the trainer's (grpo/observe/step_line.py).
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def without_launcher_args(argv: list[str]) -> list[str]:
    """`argv` minus a `--local_rank=N` / `--local-rank N` that a launcher put in front of ours
    (DeepSpeed's does; torchrun, which launch.sh uses, passes LOCAL_RANK in the environment)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--local_rank", "--local-rank"):
            skip = True
        elif not arg.startswith(("--local_rank=", "--local-rank=")):
            out.append(arg)
    return out


def main(role: str, argv: list[str]) -> int:
    die_with_parent()  # a trainer rank dies with its launcher, a role with launch.sh
    keep_freed_memory()
    argv = without_launcher_args(argv)
    prog = {"sampler": "sampling_worker.py", "reward": "reward_worker.py"}.get(
        role, "training_worker.py"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.format(prog=prog))
        return 0 if argv else 2
    if argv[0] == "--help-keys":
        print("\n".join(describe()))
        return 0
    setup_logging(role)
    log = logging.getLogger(f"grpo.{role}")
    try:
        cfg = load_config(argv[0], argv[1:])
        check_names(cfg)
        # The sampler reads its train rows itself next, before any model loads (a bad row is
        # one line there too): read here, they would be read twice at every start.
        preflight(cfg, role, read_rows=False)
    except ConfigError as e:
        if not told_torchrun(f"config error: {e}"):  # several ranks: said once
            log.error("config error: %s", e)
        return 2
    try:
        if role == "sampler":
            from grpo.sampler.loop import run_sampler

            return run_sampler(cfg)
        if role == "reward":
            from grpo.reward_service.server import run_reward_server

            return run_reward_server(cfg)
        import torch

        # Named before DeepSpeed is imported, which guesses otherwise (with a warning on CPU).
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
        from grpo.trainer.process import run_trainer

        return run_trainer(cfg)
    except RewardFailingError as e:
        # The user's reward failed past reward.max_error_rate (or on a whole first batch): a
        # restart would score the same questions with the same function, so it is the run's
        # input, not a crash. 2: launch.sh stops the run, named, instead of restarting the
        # sampler three times (a 1-step run of a reward that raised on every answer took
        # minutes and three rotated run dirs to end with exit 1).
        log.error("%s", e)
        return 2
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        # Bad data paths, reward specs, model dirs, a diverged loss: one line naming the culprit
        # (GRPO_DEBUG=1 shows it).
        code, line = exit_code_for(ACTIVITY.snapshot().phase), f"{type(e).__name__}: {e}"
        debug = bool(os.environ.get("GRPO_DEBUG"))
        if code != 2 or debug or not told_torchrun(line):  # several ranks: said once
            log.error("%s", line, exc_info=debug)
        return code


def exit_code_for(phase: str) -> int:
    """The exit code of a role that failed with one of the errors main names, in `phase` (its
    activity, grpo.runtime.progress). 2, which launch.sh reads as a usage or config error and
    does not heal, only while the role was still starting: its input (data, model, reward,
    saved state) is wrong, and a restart would fail the same way. Once it worked, 1: a
    failure of the run, which launch.sh heals by a restart from the last saved state."""
    return 2 if phase == STARTING else 1


LAUNCH_ENV_USAGE = """usage: python -m grpo launch-env CONFIG [key=value ...]
  what launch.sh runs first: check the config (as grpo check), then print as shell assignments
  each role's GPUs and the config values launch.sh needs (ROLE=sampler|trainer|both)"""


def launch_env(argv: list[str]) -> int:
    """Check the config and print shell assignments for launch.sh: each role's
    CUDA_VISIBLE_DEVICES value, and the config values launch.sh needs (one Python start-up
    for all of them: each costs a run a fraction of a second)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(LAUNCH_ENV_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    role = os.environ.get("ROLE", "both")
    try:
        cfg = load_config(argv[0], argv[1:])
        check_names(cfg)  # launch.sh's one up-front check, in the process that imports torch
        preflight(cfg, role)  # and what the roles it starts will open
        ids = visible_gpus()
        p = placement_for(cfg, role, len(ids))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(f"TRAINER_GPUS={','.join(ids[i] for i in p.trainer)}")
    print(f"SAMPLER_GPUS={','.join(ids[i] for i in p.sampler)}")
    print(f"SHARED={int(p.shared)}")
    print(f"MODEL_PATH={shlex.quote(cfg.model.path)}")
    print(f"RUN_DIR={shlex.quote(str(cfg.run_dir.resolve()))}")  # the roles' cwd is this one's
    served = bool(cfg.reward_server.backend) or serves_teacher(cfg)
    print(f"REWARD_SERVICE={int(served)}")  # launch.sh's both roles start the service too
    return 0
