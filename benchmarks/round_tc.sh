#!/usr/bin/env bash
# One device call for a round of GPU work (tensor cores, issue 35; the simulator, issue 34;
# first use, workloads and JAX per call, issue 37), from the repository root with .whl carried.
#   bash benchmarks/round_tc.sh [tests] [sim] [bench] [notebooks] [firstuse] [workloads] [jax]
# Environment: TEST_FILES, TESTS_LIMIT, SIM_KERNELS, SIM_LIMIT, BENCH_ARGS, BENCH_LIMIT,
# NOTEBOOKS, NOTEBOOKS_LIMIT, FIRSTUSE_ROUNDS, FIRSTUSE_LIMIT, WORKLOADS_ARGS, WORKLOADS_LIMIT,
# JAX_ARGS, JAX_LIMIT (seconds per part).  The tests part ends with SIGINT at its limit, so that
# pytest still prints the failures it has seen (a killed run printed none: 2026-11-27 23:30).
set -u
. benchmarks/device_setup.sh >/dev/null 2>&1 || exit 1
export PNEX_EXPECT_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# Each part's log and the results files and notebooks it wrote go into ONE archive,
# $OUT/round.tgz, remade as soon as the part ends (the device tool brings back at most 8
# files; a call cut off by its time limit still brings back every part that finished):
#   tar -xzf <files_at>/round.tgz -C <somewhere>
OUT=${OUT:-./gpu-out}; STAGE=$(mktemp -d); LOGS=$STAGE/logs; mkdir -p "$LOGS" "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
for part in "$@"; do
  t0=$SECONDS; stamp=$(mktemp); touch "$stamp"
  case $part in
    tests) timeout -s INT -k 30 "${TESTS_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -rf ${TEST_FILES:-tests/test_tc_gpu.py tests/test_tc_checked_gpu.py tests/test_simulator_gpu.py} > "$LOGS/tests.log" 2>&1 ;;
    sim) timeout "${SIM_LIMIT:-200}" python3 benchmarks/sim_vs_gpu.py --kernels "${SIM_KERNELS:-300}" > "$LOGS/sim.log" 2>&1 ;;
    bench) timeout "${BENCH_LIMIT:-330}" python3 benchmarks/tensor_cores.py ${BENCH_ARGS:---profile --repeats 7 --variants wgmma:128x256x4,wgmma:128x128x3,wgmma:128x256x3,mma:128x128x3} > "$LOGS/bench.log" 2>&1 ;;
    notebooks) timeout "${NOTEBOOKS_LIMIT:-540}" python3 benchmarks/run_notebooks.py ${NOTEBOOKS:-} > "$LOGS/notebooks.log" 2>&1 ;;
    firstuse) { timeout "${FIRSTUSE_LIMIT:-240}" python3 benchmarks/first_use_phases.py --rounds "${FIRSTUSE_ROUNDS:-5}" &&
                timeout "${FIRSTUSE_LIMIT:-240}" python3 benchmarks/first_use.py --rounds "${FIRSTUSE_ROUNDS:-5}" --seconds $(( ${FIRSTUSE_LIMIT:-240} * 2 / 3 )); } > "$LOGS/firstuse.log" 2>&1 ;;
    workloads) timeout "${WORKLOADS_LIMIT:-300}" python3 benchmarks/workloads.py ${WORKLOADS_ARGS:-} > "$LOGS/workloads.log" 2>&1 ;;
    jax) timeout "${JAX_LIMIT:-200}" python3 benchmarks/jax_overhead.py ${JAX_ARGS:-} > "$LOGS/jax.log" 2>&1 ;;
    *) echo "unknown part $part" > "$LOGS/$part.log" ;;
  esac
  echo "$part: rc=$? $((SECONDS - t0)) s" | tee -a "$LOGS/summary.txt"
  find benchmarks/results notebooks /tmp -maxdepth 3 -newer "$stamp" -type f \( -path "benchmarks/*" -o -path "notebooks/*" -o -name "*.failed.ipynb" \) -print0 | xargs -0 -r cp --parents -t "$STAGE"
  tar -czf "$OUT/round.tgz" -C "$STAGE" .
done
for f in tests sim; do [ -e "$LOGS/$f.log" ] && tail -6 "$LOGS/$f.log"; done
[ -e "$LOGS/bench.log" ] && grep -E "^(f16|bf16|attention|epilogue|profile)" "$LOGS/bench.log" | tail -20
[ -e "$LOGS/notebooks.log" ] && tail -12 "$LOGS/notebooks.log"
for f in firstuse workloads jax; do [ -e "$LOGS/$f.log" ] && { echo "== $f"; grep -iE "goal|MET|total|run all|per call|pnex" "$LOGS/$f.log" | tail -14; }; done
cat "$LOGS/summary.txt"
