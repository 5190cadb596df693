#!/usr/bin/env bash
# One-GPU check, < 10 minutes: the tests that need CUDA (among them flex_attention forward and backward
# for context-parallel ranks simulated on one GPU; real cp = 2 over NCCL only where it finds ≥ 2 GPUs),
# then the ~1B bf16 benchmark (compiled layers off/on × causal/document attention, one JSON line each).
#
#   bash tools/gpu_check.sh            # from the repository root
#
# Uses the README's .venv when its torch sees a GPU, else python3 (e.g. torch preinstalled), or
# $PYTHON. torch is never reinstalled: the project is imported from this checkout (PYTHONPATH) and
# only its small missing dependencies are pip-installed (skipped with a note when offline).
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
  echo "gpu_check: $PY has no torch that sees a CUDA device; run it on a GPU machine" >&2
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this checkout, installed or not
missing=()
for mod in numpy yaml tokenizers click tqdm safetensors jinja2 pytest hypothesis; do
  "$PY" -c "import $mod" 2>/dev/null || missing+=("$mod")
done
if ((${#missing[@]})); then
  pkgs=("${missing[@]/#yaml/pyyaml}")
  echo "gpu_check: installing ${pkgs[*]} (torch is left as it is)"
  "$PY" -m pip install -q "${pkgs[@]}" || echo "gpu_check: could not install ${pkgs[*]} (offline?); going on" >&2
fi
"$PY" -c "import torch; print('gpu_check:', torch.__version__, torch.cuda.get_device_name(0))"

echo "== tests marked cuda"
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if ((gpus >= 2)); then
  echo "gpu_check: $gpus GPUs: real cp = 2 runs (test_cp2_on_two_gpus_trains_like_one)"
else
  echo "gpu_check: 1 GPU: cp ranks simulated on it; real cp = 2 needs 2 GPUs (skipped)"
fi
tests_rc=0
if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  # only the files that hold cuda tests: collecting the others would import their extra dependencies
  mapfile -t files < <(grep -rl --include="test_*.py" "mark.cuda" tests)
  timeout 300 "$PY" -m pytest -q -m cuda "${files[@]}" -p no:cacheprovider || tests_rc=$?
  if [[ $tests_rc -eq 5 ]]; then tests_rc=0; fi  # 5: no test collected
else
  echo "gpu_check: pytest or hypothesis missing, tests skipped" >&2
fi

echo "== bench_engine --gpu-1b (JSON lines)"
timeout 240 "$PY" tools/bench_engine.py --gpu-1b --steps "${STEPS:-10}"
exit "$tests_rc"
