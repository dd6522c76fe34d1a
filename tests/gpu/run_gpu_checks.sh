#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and PyTorch + Triton already installed
# (it needs no network): installs slotwise from this working tree into a fresh venv that
# sees the packages of $PYTHON (default python3, itself possibly a venv), then runs
#   1. the tests marked `cuda`, among them TRITON_PAGED's bound launch against its JIT
#      fallback                                                  (cap $GPU_TESTS_TIMEOUT, 100 s)
#   2. the GPU decode benchmark on `small`, batch 1 and 8        (cap $GPU_DECODE_TIMEOUT, 120 s)
#   3. the step-host-overhead benchmark with CUDA graphs, Triton (its JSON's
#      attention_launch says whether the kernel launched bound), batch 1, PIECEWISE and
#      FULL_AND_PIECEWISE                                        (cap $STEP_HOST_TIMEOUT, 30 s, each)
#   4. the GPU decode benchmark on Llama-3.2-1B's shapes, batch 1 and 8, eager, piecewise,
#      full graphs and reduce-overhead, level-3 pieces uncompiled (cap $GPU_1B_TIMEOUT, 130 s)
# Each part is stopped (`timeout`) at its cap or at the end of the whole script's budget,
# $GPU_CHECKS_BUDGET seconds from its start (default 415, set-up included), whichever
# comes first, so the script ends within 7 minutes on one H100.  A part that fails or is
# stopped makes the exit status non-zero and prints "!! <part> failed", its exit status
# (124: stopped at its limit) and its last lines, again in the summary at the end; the
# next part still runs.  Results go to $OUT (or benchmarks/results): gpu_tests.xml,
# gpu_decode.{json,md}, step_host_overhead.{json,md} (PIECEWISE),
# step_host_overhead_full.{json,md} (FULL_AND_PIECEWISE), gpu_decode_1b.{json,md}, and
# each part's whole output in logs/.
#
# Dry run without a GPU (simulated graphs, timings meaningless), as tests/gpu/test_gpu_scripts.py
# runs it: SLOTWISE_PLATFORM=ascend_stub SLOTWISE_ASCEND_STUB_DEVICES=1 \
#   GPU_DECODE_ARGS="--preset tiny --backend eager" GPU_1B_ARGS="--preset tiny" \
#   STEP_HOST_OVERHEAD_ARGS="--device cpu --preset tiny --rounds 2 --steps 2" bash $0
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-benchmarks/results}"
logs="$out/logs"
mkdir -p "$out" "$logs"
python="${PYTHON:-python3}"
deadline=$((SECONDS + ${GPU_CHECKS_BUDGET:-415}))
tests_timeout="${GPU_TESTS_TIMEOUT:-100}"
decode_timeout="${GPU_DECODE_TIMEOUT:-120}"
step_host_timeout="${STEP_HOST_TIMEOUT:-30}"
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
failures=()
part() {  # part NAME CAP COMMAND...: run COMMAND for at most CAP seconds, or what is left of
    # the budget; its output is shown as it comes and kept in $logs.  On failure: its exit
    # status and last lines, now and in the summary, and a non-zero exit status at the end.
    local name=$1 cap=$2 left=$((deadline - SECONDS)) limit log pid rc=0
    shift 2
    limit=$((cap < left ? cap : (left > 1 ? left : 1)))
    log="$logs/$(tr -c 'A-Za-z0-9\n' '_' <<<"$name").log"
    echo "== $name (at $SECONDS s, limit $limit s)"
    # The log, not a pipe: a process the part leaves behind cannot keep the script waiting.
    # Made first, so that tail finds it however late the part starts.
    : >"$log"
    timeout "$limit" "$@" >>"$log" 2>&1 &
    pid=$!
    tail -n +1 --pid="$pid" -f "$log"
    wait "$pid" || rc=$?
    if ((rc != 0)); then
        local why="exit $rc"
        ((rc == 124)) && why+=", stopped at its limit of $limit s"
        failures+=("$name ($why)")
        echo "!! $name failed ($why); its last lines (all of it in $log):"
        tail -n 25 "$log" | sed 's/^/!!   /'
        status=1
    fi
}
# shellcheck disable=SC2086  # the *_ARGS variables hold several arguments
part "tests marked cuda" "$tests_timeout" "$venv/bin/python" -m pytest -m cuda -q \
    -p no:cacheprovider tests engine/tests plugins/cuda/tests --junitxml="$out/gpu_tests.xml"
# shellcheck disable=SC2086
part "gpu_decode, small" "$decode_timeout" "$venv/bin/python" benchmarks/gpu_decode.py \
    --out-dir "$out" --batch-sizes 1,8 ${GPU_DECODE_ARGS:-}
for mode in PIECEWISE FULL_AND_PIECEWISE; do
    name=step_host_overhead
    [[ $mode == PIECEWISE ]] || name+=_full
    # shellcheck disable=SC2086
    part "step_host_overhead, CUDA graphs, $mode" "$step_host_timeout" "$venv/bin/python" \
        benchmarks/step_host_overhead.py --device cuda --graph-mode "$mode" --rounds 10 \
        --steps 20 --out-dir "$out" --name "$name" ${STEP_HOST_OVERHEAD_ARGS:-}
done
# shellcheck disable=SC2086
part "gpu_decode, 1b" "$one_b_timeout" "$venv/bin/python" benchmarks/gpu_decode.py \
    --out-dir "$out" --name gpu_decode_1b --preset 1b --batch-sizes 1,8 --backend eager \
    --iterations 30 --no-float32-reference ${GPU_1B_ARGS:-}
for failure in ${failures[@]+"${failures[@]}"}; do
    echo "!! failed: $failure"
done
echo "== done (at $SECONDS s, exit status $status)"
exit "$status"
