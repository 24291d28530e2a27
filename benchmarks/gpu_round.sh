#!/usr/bin/env bash
# One batched round on the GPU machine (the `device` tool), from the repo root, with .whl carried:
#   bash benchmarks/gpu_round.sh PHASE...
# Phases: tests (benchmarks/gpu_tests.sh, independent files $JOBS at a time, timing-sensitive ones alone),
# autotune, checked, jax, export, overhead, firstuse, profile (first use under cProfile), cellprofile (the first %%pnex cell of a fresh environment under cProfile), driver (the Python launcher per call, by part), cuda12, workloads,
# derived (derived backward kernels), gridrandom (grid sync and random numbers), docexamples (the ported
# numba-cuda documentation examples), notebooks, probe (benchmarks/probes.py $PROBES, default muladd-ncu), fresh (benchmarks/fresh_env.py:
# the first run in a fresh environment, FRESH_ROUNDS, FRESH_ARGS), build (benchmarks/launcher_build.py
# against BUILD_BEFORE).  A phase written NAME@
# runs in the background beside the next ones (for phases that time nothing on the GPU, such as cuda12);
# the round waits for it at the end.  Each phase runs under its own time limit and logs to
# logs/<phase>.log; everything it writes (logs, benchmarks/results/*.json,
# executed notebooks) goes into ONE archive, $OUT/round.tgz (the tool returns at most 8 files), and a
# summary table is printed last.  Environment: JOBS, PER_FILE_TIMEOUT, TEST_FILES (tests), NOTEBOOKS,
# ROUNDS (overhead), FIRSTUSE_ROUNDS, JAX_ARGS (e.g. "--only diffusion"), TESTS_LIMIT / AUTOTUNE_LIMIT / JAX_LIMIT / OVERHEAD_LIMIT / NOTEBOOKS_LIMIT (seconds per
# phase), LIMIT_OVERRIDE (every phase).
set -u
. benchmarks/device_setup.sh || exit 1
export PNEX_EXPECT_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-./gpu-out}; mkdir -p "$OUT" logs
start_all=$SECONDS
summary=()
stamp=$(mktemp); touch "$stamp"
phase() {  # phase NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "logs/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -v '^\s*$' "logs/$name.log" | tail -1 | cut -c1-150)
  printf '%-10s rc=%-3s %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) "$last" > "logs/$name.summary"
}
background=()
for arg in "$@"; do
  p=${arg%@}
  if [ "$p" != "$arg" ]; then run_bg=1; else run_bg=0; fi
  case $p in
    tests) cmd=(env OUT=$PWD/logs/tests PER_FILE_TIMEOUT=${PER_FILE_TIMEOUT:-300} bash benchmarks/gpu_tests.sh ${TEST_FILES:-}); limit=${TESTS_LIMIT:-420} ;;
    autotune) cmd=(python3 benchmarks/autotune.py); limit=${AUTOTUNE_LIMIT:-300} ;;
    checked) cmd=(python3 benchmarks/checked_overhead.py); limit=200 ;;
    jax) cmd=(python3 benchmarks/jax_overhead.py ${JAX_ARGS:-}); limit=${JAX_LIMIT:-300} ;;
    export) cmd=(python3 benchmarks/export_check.py); limit=240 ;;
    overhead) cmd=(python3 benchmarks/overhead.py --signatures-only --skip-max-autotune --skip-first-use --rounds ${ROUNDS:-5}); limit=${OVERHEAD_LIMIT:-300} ;;
    firstuse) cmd=(python3 benchmarks/first_use.py --rounds ${FIRSTUSE_ROUNDS:-3}); limit=300 ;;
    profile) cmd=(python3 benchmarks/first_use.py --profile-only); limit=200 ;;
    cellprofile) cmd=(python3 benchmarks/fresh_env.py --profile-first-cell); limit=120 ;;
    driver) cmd=(python3 benchmarks/driver_overhead.py); limit=120 ;;
    cuda12) cmd=(python3 benchmarks/cuda12_check.py); limit=240 ;;
    workloads) cmd=(python3 benchmarks/workloads.py); limit=300 ;;
    probe) cmd=(env OUT=$PWD/logs/probes python3 benchmarks/probes.py ${PROBES:-muladd-ncu}); limit=${PROBE_LIMIT:-300} ;;
    notebooks) cmd=(python3 benchmarks/run_notebooks.py ${NOTEBOOKS:-}); limit=${NOTEBOOKS_LIMIT:-420} ;;
    derived) cmd=(python3 benchmarks/derived_backward.py); limit=${DERIVED_LIMIT:-240} ;;
    gridrandom) cmd=(python3 benchmarks/grid_random.py); limit=${GRIDRANDOM_LIMIT:-240} ;;
    docexamples) cmd=(python3 benchmarks/doc_examples.py); limit=${DOCEXAMPLES_LIMIT:-180} ;;
    fresh) cmd=(python3 benchmarks/fresh_env.py --rounds ${FRESH_ROUNDS:-2} ${FRESH_ARGS:-}); limit=${FRESH_LIMIT:-540} ;;
    build) cmd=(python3 benchmarks/launcher_build.py --rounds ${BUILD_ROUNDS:-2} --before ${BUILD_BEFORE:-397e29b} --jobs 0); limit=${BUILD_LIMIT:-300} ;;
    *) echo "$p: unknown phase" > "logs/$p.summary"; continue ;;
  esac
  limit=${LIMIT_OVERRIDE:-$limit}
  if [ $run_bg = 1 ]; then
    phase "$p" "$limit" "${cmd[@]}" & background+=($!)
  else
    phase "$p" "$limit" "${cmd[@]}"
  fi
done
for pid in "${background[@]}"; do wait "$pid"; done
for arg in "$@"; do p=${arg%@}; [ -e "logs/$p.summary" ] && summary+=("$(cat "logs/$p.summary")"); done
# Results written this round, executed notebooks and every log, in one archive.
find benchmarks/results notebooks -newer "$stamp" -type f > logs/files.txt
tar czf "$OUT/round.tgz" logs $(cat logs/files.txt) 2>/dev/null
ls -la "$OUT/round.tgz"
echo "== round: $(( SECONDS - start_all )) s"
for f in logs/tests/*.log; do [ -e "$f" ] && printf '   %s\n' "$(basename "$f" .log): $(grep -E 'passed|failed|error' "$f" | tail -1)"; done
printf '%s\n' "${summary[@]}"
