. benchmarks/device_setup.sh > /tmp/setup.log 2>&1; export PNEX_EXPECT_GPU=1; touch /tmp/stamp
D=benchmarks/results/logs-2026-11-29d-h200
nvidia-smi --query-gpu=name --format=csv,noheader
export PNEX_CACHE_DIR=/tmp/fresh-cache; rm -rf $PNEX_CACHE_DIR
for run in first second third; do python3 $D/first_process.py $run 2>&1 | grep -v Warn | tail -1; done
python3 -c 'import sys; sys.path.insert(0,"examples/tensor_cores"); from gemm_tma import TmaLinear as T; T("f16",256,4,True)' > /tmp/b.log 2>&1
timeout 300 python3 benchmarks/epilogue_pairs.py --shapes 4096,4096,4096 --shapes 8192,4096,4096 --shapes 8192,16384,4096 --rounds 12 \
  --contenders cublas,eager,compile,persistent,persistent_gelu_poly > /tmp/pairs.log 2>&1; echo "pairs rc=$?"
find benchmarks/results -newer /tmp/stamp -type f -name "*.json" -exec cp {} $OUT/ \;
cp /tmp/pairs.log $OUT/pairs.log
grep -E "paired|eager |compile |persistent|cublas" /tmp/pairs.log | tail -24
