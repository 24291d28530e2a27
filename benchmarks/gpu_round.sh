#!/usr/bin/env bash
# One batched round on the GPU machine (the `device` tool), from the repo root, with .whl carried:
#   bash benchmarks/gpu_round.sh PHASE...
# Phases: tests (benchmarks/gpu_tests.sh, independent files 4 at a time, timing-sensitive ones alone),
# autotune, checked, jax, export, overhead, cuda12, workloads, notebooks.  Each phase runs under its own
# time limit and logs to logs/<phase>.log; everything it writes (logs, benchmarks/results/*.json,
# executed notebooks) goes into ONE archive, $OUT/round.tgz (the tool returns at most 8 files), and a
# summary table is printed last.
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
  summary+=("$(printf '%-10s rc=%-3s %4ds  %s' "$name" "$rc" $((SECONDS - t0)) "$last")")
}
for p in "$@"; do
  case $p in
    tests)
      OUT=$PWD/logs/tests PER_FILE_TIMEOUT=300 phase tests 420 bash benchmarks/gpu_tests.sh ;;
    autotune) phase autotune 300 python3 benchmarks/autotune.py ;;
    checked) phase checked 200 python3 benchmarks/checked_overhead.py ;;
    jax) phase jax 300 python3 benchmarks/jax_overhead.py ;;
    export) phase export 240 python3 benchmarks/export_check.py ;;
    overhead) phase overhead 300 python3 benchmarks/overhead.py --skip-old --skip-load-inline ;;
    cuda12) phase cuda12 200 python3 benchmarks/cuda12_check.py ;;
    workloads) phase workloads 300 python3 benchmarks/workloads.py ;;
    notebooks) phase notebooks 420 python3 benchmarks/run_notebooks.py notebooks/0[1-6]_*.ipynb ;;
    *) summary+=("$p: unknown phase") ;;
  esac
done
# Results written this round, executed notebooks and every log, in one archive.
find benchmarks/results notebooks -newer "$stamp" -type f > logs/files.txt
tar czf "$OUT/round.tgz" logs $(cat logs/files.txt) 2>/dev/null
ls -la "$OUT/round.tgz"
echo "== round: $(( SECONDS - start_all )) s"
for f in logs/tests/*.log; do [ -e "$f" ] && printf '   %s\n' "$(basename "$f" .log): $(grep -E 'passed|failed|error' "$f" | tail -1)"; done
printf '%s\n' "${summary[@]}"
