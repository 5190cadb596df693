#!/usr/bin/env bash
# One-GPU check, < 10 minutes by construction: tools/gpu_check.py runs its parts (the tests marked cuda, the
# ~1B benchmark rows one process each, attention kernels alone, the cp simulation timed, bf16 against fp32,
# pipeline parallelism on the installed torch), each with its own timeout; the timeouts and this set-up add
# up to less than 10 minutes. One JSON line per result; the last line says which parts ran, failed or timed
# out. Exits 1 when the tests could not run or failed (see docs/performance.md, "Reading gpu_check's output").
#
#   bash tools/gpu_check.sh            # from the repository root
#
# Uses the README's .venv when its torch sees a GPU, else python3 (e.g. torch preinstalled), or $PYTHON.
# torch is never reinstalled: the project is imported from this checkout (PYTHONPATH). Only pytest is
# required beyond the runtime's own imports; a missing one is pip-installed once, without retries (the lent
# machine may reach nothing outside), and the check stops when pytest is still missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    PY=.venv/bin/python
  else
    PY=python3
  fi
fi
if ! "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "error: gpu_check: $PY has no torch that sees a CUDA device; run it on a GPU machine" >&2
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this checkout, installed or not
missing=()
for mod in numpy yaml tokenizers pytest; do
  "$PY" -c "import $mod" 2>/dev/null || missing+=("$mod")
done
if ((${#missing[@]})); then
  pkgs=("${missing[@]/#yaml/pyyaml}")
  echo "gpu_check: installing ${pkgs[*]} (torch is left as it is)"
  timeout 25 "$PY" -m pip install -q --retries 0 --timeout 5 "${pkgs[@]}" \
    || echo "gpu_check: could not install ${pkgs[*]} (offline?)" >&2
fi
if ! "$PY" -c "import pytest" 2>/dev/null; then
  echo "error: gpu_check: pytest is missing and could not be installed: the tests cannot run; install pytest" \
       "into $PY (pip install pytest) and rerun" >&2
  exit 1
fi
"$PY" -c "import json, torch; print(json.dumps({'part': 'device', 'torch': torch.__version__,
  'device': torch.cuda.get_device_name(0), 'gpus': torch.cuda.device_count()}))"
exec "$PY" tools/gpu_check.py
