#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and PyTorch + Triton already installed
# (it needs no network): installs slotwise from this working tree into a venv that sees
# the system's packages, runs the tests marked `cuda` and the GPU decode benchmark.
# Ends within 5 minutes. Results go to $OUT (or benchmarks/results).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
python="${PYTHON:-python3}"
venv="$(mktemp -d)/venv"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$python" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation --no-index \
    -e . -e plugins/cpu -e plugins/cuda -e plugins/ascend_stub
"$venv/bin/python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
"$venv/bin/slotwise" env

status=0
timeout 130 "$venv/bin/python" -m pytest -m cuda -q -p no:cacheprovider tests \
    --junitxml="$out/gpu_tests.xml" || status=$?
timeout 130 "$venv/bin/python" benchmarks/gpu_decode.py --out-dir "$out" || status=$?
exit "$status"
