#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and PyTorch + Triton already installed
# (it needs no network): installs slotwise from this working tree into a fresh venv that
# sees the packages of $PYTHON (default python3, itself possibly a venv), then runs
#   1. the tests marked `cuda`                                   (cap $GPU_TESTS_TIMEOUT, 100 s)
#   2. the GPU decode benchmark on `small`, batch 1 and 8        (cap $GPU_DECODE_TIMEOUT, 120 s)
#   3. the step-host-overhead benchmark with CUDA graphs, Triton (cap $STEP_HOST_TIMEOUT, 35 s)
#   4. the GPU decode benchmark on Llama-3.2-1B's shapes, batch 1 and 8, eager, piecewise,
#      full graphs and reduce-overhead, level-3 pieces uncompiled (cap $GPU_1B_TIMEOUT, 130 s)
# Each part is stopped (`timeout`) at its cap or at the end of the whole script's budget,
# $GPU_CHECKS_BUDGET seconds from its start (default 400, set-up included), whichever
# comes first, so the script ends within 7 minutes on one H100.  A part that fails or is
# stopped makes the exit status non-zero (the step-host-overhead benchmark only prints
# that it failed) and the next part still runs.  Results go to $OUT (or
# benchmarks/results): gpu_tests.xml, gpu_decode.{json,md}, step_host_overhead.{json,md},
# gpu_decode_1b.{json,md}.
#
# Dry run without a GPU (simulated graphs, timings meaningless), as tests/gpu/test_gpu_scripts.py
# runs it: SLOTWISE_PLATFORM=ascend_stub SLOTWISE_ASCEND_STUB_DEVICES=1 \
#   GPU_DECODE_ARGS="--preset tiny --backend eager" GPU_1B_ARGS="--preset tiny" \
#   STEP_HOST_OVERHEAD_ARGS="--device cpu --preset tiny --rounds 2 --steps 2" bash $0
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
python="${PYTHON:-python3}"
deadline=$((SECONDS + ${GPU_CHECKS_BUDGET:-400}))
tests_timeout="${GPU_TESTS_TIMEOUT:-100}"
decode_timeout="${GPU_DECODE_TIMEOUT:-120}"
step_host_timeout="${STEP_HOST_TIMEOUT:-35}"
one_b_timeout="${GPU_1B_TIMEOUT:-130}"
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
    -e . -e engine -e plugins/cpu -e plugins/cuda -e plugins/ascend_stub
"$venv/bin/python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
"$venv/bin/slotwise" env

status=0
part() {  # part NAME CAP: announce the part; its limit: CAP, or what is left of the budget
    local left=$((deadline - SECONDS))
    limit=$(($2 < left ? $2 : (left > 1 ? left : 1)))
    echo "== $1 (at $SECONDS s, limit $limit s)"
}
part "tests marked cuda" "$tests_timeout"
timeout "$limit" "$venv/bin/python" -m pytest -m cuda -q -p no:cacheprovider tests plugins/cuda/tests \
    --junitxml="$out/gpu_tests.xml" || status=$?
part "gpu_decode, small" "$decode_timeout"
# shellcheck disable=SC2086  # the *_ARGS variables hold several arguments
timeout "$limit" "$venv/bin/python" benchmarks/gpu_decode.py --out-dir "$out" \
    --batch-sizes 1,8 ${GPU_DECODE_ARGS:-} || status=$?
part "step_host_overhead, CUDA graphs" "$step_host_timeout"
# shellcheck disable=SC2086
timeout "$limit" "$venv/bin/python" benchmarks/step_host_overhead.py \
    --device cuda --rounds 10 --steps 20 --out-dir "$out" ${STEP_HOST_OVERHEAD_ARGS:-} \
    || echo "step_host_overhead failed (exit $?; limit $limit s)"
part "gpu_decode, 1b" "$one_b_timeout"
# shellcheck disable=SC2086
timeout "$limit" "$venv/bin/python" benchmarks/gpu_decode.py --out-dir "$out" \
    --name gpu_decode_1b --preset 1b --batch-sizes 1,8 --backend eager \
    --iterations 30 --no-float32-reference ${GPU_1B_ARGS:-} || status=$?
echo "== done (at $SECONDS s, exit status $status)"
exit "$status"
