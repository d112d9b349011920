#!/usr/bin/env bash
# Start a run: the sampler and the trainer (N ranks) as separate processes.
#
#   bash launch.sh CONFIG.yaml [section.key=value ...]            both roles on this machine
#   ROLE=trainer bash launch.sh CONFIG.yaml ...                     the trainer only (its node)
#   ROLE=sampler bash launch.sh CONFIG.yaml ...                     the sampler only (its node)
#   ROLE=reward bash launch.sh CONFIG.yaml ...                      the reward service only
#
# The trainer runs train.num_ranks processes on this node (torchrun, on CPU and GPU alike; a
# trainer over several nodes: ROLE=trainer with train.node_rank on each). Each role gets its
# GPUs in CUDA_VISIBLE_DEVICES (grpo/runtime/placement.py). Addresses come from the config. A role
# that dies is restarted (GRPO_MAX_RESTARTS, default 3: see Healing below); one that cannot heal
# stops the others and this script exits non-zero; Ctrl-C stops all. With
# reward_server.backend or teacher.where=service set, both roles come with the reward service
# (stopped at the end).
# Relative paths in the config are looked for from where you stand, then from the repository
# root; output_dir is relative to the repository root.
set -uo pipefail
# The supervisor below waits with `wait -n -p` (bash 5.1): an older bash would fail there, after
# every role had started.
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 501 )); then
  echo "launch.sh: needs bash 5.1 or newer (it waits with wait -n -p); this is bash $BASH_VERSION" >&2
  exit 2
fi
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  echo "usage: bash launch.sh CONFIG.yaml [section.key=value ...] [--resume]  (grpo launch: the same)"
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 1 ]] && exit 0 || exit 2  # asked for help: no error
fi
# The config path is taken from where you stand, and so are the relative paths inside it (data,
# model, DeepSpeed config) and your reward modules, falling back to the repository root, where
# the roles run (grpo/core/paths.py); output_dir is relative to the repository root.
if [[ -f $1 ]]; then set -- "$(realpath "$1")" "${@:2}"; fi
export GRPO_USER_DIR=${GRPO_USER_DIR:-$PWD}
cd "$(dirname "$0")"
PY=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
ROLE=${ROLE:-both}
case $ROLE in both|sampler|trainer|reward) ;; *) echo "launch.sh: ROLE must be sampler, trainer, reward or both, got '$ROLE'" >&2; exit 2;; esac
# The healing knobs (below): bash arithmetic would read "5s" as 0.
for knob in GRPO_MAX_RESTARTS GRPO_RESTART_DELAY_S; do
  [[ -z ${!knob:-} || ${!knob} =~ ^[0-9]{1,6}$ ]] || {
    echo "launch.sh: $knob must be a whole number (0 to 999999), got '${!knob:0:40}'" >&2; exit 2; }
done

# Validate the config once, up front (values, and the names of the loss, estimator, task and
# engine), and place each role on this node's GPUs (none on a CPU node): a typo stops here with
# one line naming the key. Sets TRAINER_GPUS, SAMPLER_GPUS, SHARED, MODEL_PATH, RUN_DIR and
# REWARD_SERVICE (1: the config has the reward service serve a backend or the teacher).
placement=$(ROLE=$ROLE "$PY" -m grpo launch-env "$@") || exit 2
eval "$placement"

# Convert the embedded model once, before two processes would both want to.
if [[ $MODEL_PATH == embedded ]]; then
  "$PY" -m grpo.models.convert >/dev/null || { echo "launch.sh: could not prepare the embedded model" >&2; exit 1; }
fi

gpus() { [[ -z $1 ]] || export CUDA_VISIBLE_DEVICES=$1; }

# Each role execs its process, so the pid launch.sh holds is the worker's and a signal reaches it.
# The trainer's command is the same on CPU and GPU.
start_trainer() { gpus "$TRAINER_GPUS"; exec "$PY" -m grpo.trainer.launch "$@"; }
start_sampler() {
  gpus "$SAMPLER_GPUS"
  export GRPO_SHARED_GPU=$SHARED  # one GPU for both roles: the sampler caps its memory
  exec "$PY" sampling_worker.py "$@"
}
# The reward service shares the sampler's GPUs (its own node: ROLE=reward sees them all).
start_reward() { gpus "$SAMPLER_GPUS"; exec "$PY" reward_worker.py "$@"; }

case $ROLE in
  trainer) start_trainer "$@" ;;
  sampler) start_sampler "$@" ;;
  reward) start_reward "$@" ;;
esac

# Job control puts each role in its own process group, so stopping a role reaches every
# process it started (the DeepSpeed launcher does not forward signals to its ranks).
set -m
export GRPO_PARENT_PID=$$  # both roles die with this script, even of a SIGKILL (grpo/runtime/lifetime.py)

# Healing: a role that dies (a non-zero exit other than 2, a usage or config error, which would
# only fail again) is started again after a backoff (GRPO_RESTART_DELAY_S, doubling), up to
# GRPO_MAX_RESTARTS times per role, with train.resume=auto: the trainer goes on from its last
# saved state, the sampler from its spool, while the other roles keep running (a sampler waits
# transport.peer_timeout_s for a silent trainer). Each role learns its restarts so far in
# GRPO_RESTARTS (the metrics row's trainer_restarts, sampler_restarts) and how many it has left
# in GRPO_RESTARTS_LEFT (a trainer with restarts left does not tell the samplers to stop). A
# role that cannot heal (restarts used up) stops the run, named.
MAX_RESTARTS=${GRPO_MAX_RESTARTS:-3}
RESTART_DELAY_S=${GRPO_RESTART_DELAY_S:-5}
declare -A name_of pid_of restarts=([trainer]=0 [sampler]=0 ["reward service"]=0)
launch() {  # ROLE [config and overrides]: (re)start one role, in a process group of its own
  local role=$1; shift
  export GRPO_RESTARTS=${restarts[$role]} GRPO_RESTARTS_LEFT=$((MAX_RESTARTS - restarts[$role]))
  case $role in
    trainer) start_trainer "$@" & ;;
    # One writer of bars per terminal: the trainer's (its evaluations; each step is a line, not a
    # bar: grpo/observe/step_line.py); ROLE=sampler alone shows a bar of its batches.
    sampler) TQDM_DISABLE=1 start_sampler "$@" & ;;
    "reward service") start_reward "$@" & ;;
  esac
  pid_of[$role]=$!; name_of[$!]=$role
}
launch trainer "$@"
launch sampler "$@"
[[ $REWARD_SERVICE == 1 ]] && launch "reward service" "$@"

groups() { local p; for p in "${pid_of[@]}"; do echo "-$p"; done; }
alive() { local g; for g in $(groups); do kill -0 -- "$g" 2>/dev/null && return 0; done; return 1; }
stop_all() {
  kill -TERM -- $(groups) 2>/dev/null
  for _ in $(seq 30); do alive || return 0; sleep 1; done
  echo "launch.sh: still running after 30 s, killing" >&2
  kill -KILL -- $(groups) 2>/dev/null
}
# A signal ends a restart's backoff at once: every job that is no role is its sleep (found by
# jobs, not by $!, which a signal arriving between `sleep &` and the assignment would miss).
stop_backoff() { local j; for j in $(jobs -p); do [[ -n ${name_of[$j]:-} ]] || kill "$j" 2>/dev/null; done; }
trap 'echo "launch.sh: interrupted, stopping all roles" >&2; stop_backoff; stop_all; wait; exit 130' INT TERM

status=0
heard=  # a role that ended during another's backoff, and its code: handled next, as if waited for
while ((${#pid_of[@]})); do
  if [[ -n $heard ]]; then
    read -r done_pid code <<< "$heard"
    heard=
  else
    done_pid=
    wait -n -p done_pid "${pid_of[@]}"
    code=$?
    [[ -n $done_pid ]] || break  # bash already reaped the rest (after stop_all)
  fi
  role=${name_of[$done_pid]}
  unset "pid_of[$role]"
  if ((code != 0)); then
    if ((code != 2 && restarts[$role] < MAX_RESTARTS)); then
      delay=$((RESTART_DELAY_S << restarts[$role]))
      restarts[$role]=$((restarts[$role] + 1))
      echo "launch.sh: the $role exited with code $code; restarting it in $delay s" \
        "(restart ${restarts[$role]} of $MAX_RESTARTS)" >&2
      sleep "$delay" &
      backoff=$!
      # In the background: a trap runs while bash waits, not sleeps. The other roles are waited
      # for too: one that ends meanwhile is heard at once, and a usage or config error there
      # (exit 2) is one this restart would only meet again (a sampler stopped by its failing
      # reward ends the trainer first, with exit 1: no sampler left).
      woke=
      wait -n -p woke "$backoff" "${pid_of[@]}"
      woke_code=$?
      if [[ -n $woke && $woke != "$backoff" ]]; then
        heard="$woke $woke_code"
        if ((woke_code == 2)); then
          kill "$backoff" 2>/dev/null
          echo "launch.sh: the $role's restart called off (the ${name_of[$woke]} exited with code 2)" >&2
          continue
        fi
        wait "$backoff"
      fi
      launch "$role" "$@" train.resume=auto
      continue
    fi
    status=$code
    why=$( ((code == 2)) && echo "a usage or config error" || echo "its $MAX_RESTARTS restarts used up")
    echo "launch.sh: the $role exited with code $code ($why); stopping the other roles" >&2
    stop_all
    wait 2>/dev/null  # reap the stopped roles; their exit codes are a consequence, not the cause
    break
  fi
  if [[ ${!pid_of[*]} == "reward service" ]]; then  # the run is over: the service is not needed
    stop_all
    wait 2>/dev/null
    break
  fi
done
if [[ $status -eq 0 ]]; then
  echo "launch.sh: run complete; outputs in $RUN_DIR (the trainer's summary above lists them)"
fi
exit "$status"
