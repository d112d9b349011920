#!/usr/bin/env bash
# The GPU kit on the lent GPU machine (issue 46; docs/gpus.md says how to call it). From the
# repository root, with the kit (python -m scripts.gpu_kit) carried under .gpu_kit:
#   bash bench/gpu_kit.sh first     launch, speed and sync rows   (carry .gpu_kit/first)
#   bash bench/gpu_kit.sh second    the learning row, at once     (carry .gpu_kit/second)
# Installs what the image lacks from the kit's wheels (no registry), then runs bench/gpu_kit.py;
# tables and logs go to $OUT. A kit the CPU rehearsal has not passed is refused.
set -uo pipefail
cd "$(dirname "$0")/.."
call=${1:?"usage: bash bench/gpu_kit.sh first|second [--smoke]"}
shift
kit=${GRPO_KIT:-.gpu_kit}
stash=${GRPO_KIT_STASH:-/tmp/grpo_kit}
out=${OUT:-gpu_kit_out}
PY=${PYTHON:-python3}
mkdir -p "$stash" "$out"
fail() { echo "gpu kit: $*" | tee "$out/gpu_kit_$call.log" >&2; exit 2; }
[[ -f "$kit/$call/KIT.json" ]] || fail "no $kit/$call/KIT.json: carry .gpu_kit/$call (python -m scripts.gpu_kit builds it)"
if [[ ${GRPO_KIT_UNREHEARSED:-0} != 1 ]]; then
  built=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['commit'])" "$kit/$call/KIT.json")
  rehearsed=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['commit'])" "$kit/$call/REHEARSED.json" 2>/dev/null)
  [[ "$built" == "$rehearsed" ]] || fail "the kit of $built has not passed the CPU rehearsal (python -m scripts.gpu_kit --rehearse)"
fi
if [[ $call == first ]]; then  # the second call finds them where this one left them
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$stash/site" "$kit"/first/wheels/*.whl >"$stash/install.log" 2>&1 \
    || fail "installing the kit's wheels failed: $(tail -3 "$stash/install.log")"
fi
[[ -d "$stash/site" ]] || fail "$stash/site is not on this machine: run first, then second at once"
export PYTHONPATH="$stash/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHON="$PY" PYTHONUNBUFFERED=1
exec "$PY" -m bench.gpu_kit "$call" --kit "$kit" --stash "$stash" --out "$out" "$@"
