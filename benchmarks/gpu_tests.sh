#!/usr/bin/env bash
# Run the GPU-marked tests file by file on the GPU machine (a crash in one file does not
# hide the others), logs under $OUT (or ./gpu-logs), and print one summary line per file.
#   . benchmarks/device_setup.sh && bash benchmarks/gpu_tests.sh [test files...]
OUT=${OUT:-./gpu-logs}; mkdir -p "$OUT"
# A GPU is expected here: a CUDA set-up that fails fails every gpu test (tests/conftest.py), never skips it.
export PNEX_EXPECT_GPU=1
files=("$@")
[ ${#files[@]} -eq 0 ] && files=($(python3 -m pytest -m gpu tests --collect-only -q 2>/dev/null | grep '::' | cut -d: -f1 | sort -u))
summary=()
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  timeout "${PER_FILE_TIMEOUT:-400}" python3 -m pytest -m gpu "$f" -q -p no:cacheprovider -rfEs --tb=short \
    > "$OUT/$name.log" 2>&1
  rc=$?
  last=$(grep -E "passed|failed|error|no tests ran" "$OUT/$name.log" | tail -1)
  [ -z "$last" ] && last="(no summary; rc=$rc: $(tail -1 "$OUT/$name.log" | cut -c1-100))"
  summary+=("$(printf '%-26s rc=%-3s %s' "$name" "$rc" "$last")")
done
echo "== GPU tests by file"
printf '%s\n' "${summary[@]}"
