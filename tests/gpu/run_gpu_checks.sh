#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and PyTorch + Triton already installed
# (it needs no network): installs slotwise from this working tree into a fresh venv that
# sees the packages of $PYTHON (default python3, itself possibly a venv), runs the tests
# marked `cuda` and the GPU decode benchmark. Each of the two parts is stopped after
# $GPU_PART_TIMEOUT seconds (default 130, so that the script ends within 5 minutes; on
# an H200 in 2026-12 the tests took 88 to 102 s, the whole script 191 to 220 s).
# Results go to $OUT (or benchmarks/results).
#
# Dry run without a GPU (simulated graphs, timings meaningless): SLOTWISE_PLATFORM=ascend_stub
# SLOTWISE_ASCEND_STUB_DEVICES=1 GPU_DECODE_ARGS="--preset tiny --backend eager" bash $0
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
python="${PYTHON:-python3}"
part_timeout="${GPU_PART_TIMEOUT:-130}"
venv="$(mktemp -d)/venv"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# A venv made from a venv's python is based on the base interpreter and would not see
# that venv's torch: a .pth file adds $PYTHON's site directories (and their .pth files).
sites="$("$python" -c 'import site; print(repr(site.getsitepackages()))')"
"$python" -m venv --without-pip "$venv"  # pip and setuptools too come from $PYTHON
"$venv/bin/python" - "$sites" <<'EOF'
import sys, sysconfig
path = sysconfig.get_paths()["purelib"] + "/_outer_sites.pth"
open(path, "w").write(f"import site; list(map(site.addsitedir, {sys.argv[1]}))\n")
EOF
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation --no-index \
    -e . -e plugins/cpu -e plugins/cuda -e plugins/ascend_stub
"$venv/bin/python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
"$venv/bin/slotwise" env

status=0
timeout "$part_timeout" "$venv/bin/python" -m pytest -m cuda -q -p no:cacheprovider tests \
    --junitxml="$out/gpu_tests.xml" || status=$?
# shellcheck disable=SC2086  # GPU_DECODE_ARGS holds several arguments
timeout "$part_timeout" "$venv/bin/python" benchmarks/gpu_decode.py --out-dir "$out" \
    ${GPU_DECODE_ARGS:-} || status=$?
exit "$status"
