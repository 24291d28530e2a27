#!/usr/bin/env bash
# Run the GPU-marked tests file by file on the GPU machine (a crash in one file does not
# hide the others), logs under $OUT (or ./gpu-logs), and print one summary line per file.
# Files run ${JOBS:-4} at a time, except those that time kernels against each other
# (autotuning) and those that run Nsight Compute (profile: on 2026-11-29, beside seven other
# files on an H200, ncu failed once with "Failed to prepare kernel for profiling"), which run
# alone afterwards.  PNEX_EXPECT_GPU=1: a broken CUDA set-up fails
# the tests instead of skipping them as "no GPU".  PYTEST_K: a -k expression for every file
# (e.g. PYTEST_K="not aot_inductor" where the image's torch crashes loading AOTInductor packages).
#   . benchmarks/device_setup.sh && bash benchmarks/gpu_tests.sh [test files...]
OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"
export PNEX_EXPECT_GPU=1 OUT PYTEST_K
files=("$@")
[ ${#files[@]} -eq 0 ] && files=($(python3 -m pytest -m gpu tests --collect-only -q 2>/dev/null | grep '::' | cut -d: -f1 | sort -u))
run_file() {
  f=$1; name=$(basename "$f" .py)
  timeout "${PER_FILE_TIMEOUT:-400}" python3 -m pytest -m gpu "$f" -q -p no:cacheprovider -rfEs --tb=short \
    ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/$name.log" 2>&1
  echo "$?" > "$OUT/$name.rc"
}
export -f run_file
alone=(); together=()
for f in "${files[@]}"; do
  case $f in *autotune*|*_tune*|*profile*) alone+=("$f") ;; *) together+=("$f") ;; esac
done
[ ${#together[@]} -gt 0 ] && printf '%s\n' "${together[@]}" | xargs -P "${JOBS:-4}" -I{} bash -c 'run_file {}'
for f in "${alone[@]}"; do run_file "$f"; done
echo "== GPU tests by file"
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  last=$(grep -E "passed|failed|error|no tests ran" "$OUT/$name.log" | tail -1)
  [ -z "$last" ] && last="(no summary: $(tail -1 "$OUT/$name.log" | cut -c1-100))"
  printf '%-30s rc=%-3s %s\n' "$name" "$(cat "$OUT/$name.rc" 2>/dev/null)" "$last"
done
