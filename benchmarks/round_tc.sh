#!/usr/bin/env bash
# One device call for the tensor-core round (issue 35) and the CPU-path round (issue 34),
# from the repository root with .whl carried; everything it writes comes back in $OUT/a.tgz.
#   bash benchmarks/round_tc.sh [tests] [sim] [bench] [notebooks]
set -u
. benchmarks/device_setup.sh >/dev/null 2>&1 || exit 1
export PNEX_EXPECT_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT" logs
stamp=$(mktemp); touch "$stamp"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee logs/gpu.txt
for part in "$@"; do
  t0=$SECONDS
  case $part in
    tests) timeout "${TESTS_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rf ${TEST_FILES:-tests/test_tc_gpu.py tests/test_tc_checked_gpu.py tests/test_simulator_gpu.py} > logs/tests.log 2>&1 ;;
    sim) timeout "${SIM_LIMIT:-200}" python3 benchmarks/sim_vs_gpu.py --kernels "${SIM_KERNELS:-300}" > logs/sim.log 2>&1 ;;
    bench) timeout "${BENCH_LIMIT:-330}" python3 benchmarks/tensor_cores.py --profile --repeats 7 --variants "${VARIANTS:-wgmma:128x256x4,wgmma:128x128x3,wgmma:128x256x3,mma:128x128x3}" > logs/bench.log 2>&1 ;;
    notebooks) timeout "${NOTEBOOKS_LIMIT:-540}" python3 benchmarks/run_notebooks.py ${NOTEBOOKS:-} > logs/notebooks.log 2>&1 ;;
    *) echo "unknown part $part" > logs/$part.log ;;
  esac
  echo "$part: rc=$? $((SECONDS - t0)) s" | tee -a logs/summary.txt
done
find benchmarks/results notebooks -newer "$stamp" -type f > logs/files.txt
tar czf "$OUT/a.tgz" logs $(cat logs/files.txt) 2>/dev/null
for f in logs/tests.log logs/sim.log; do [ -e $f ] && tail -6 $f; done
[ -e logs/bench.log ] && grep -E "^(f16|bf16|attention|epilogue|profile)" logs/bench.log | tail -20
[ -e logs/notebooks.log ] && tail -12 logs/notebooks.log
cat logs/summary.txt
