. benchmarks/device_setup.sh > /tmp/setup.log 2>&1; export PNEX_EXPECT_GPU=1; touch /tmp/stamp
nvidia-smi --query-gpu=name --format=csv,noheader
W='import sys; sys.path.insert(0,"examples/tensor_cores"); from gemm_tma import TmaLinear as T;'
for cfg in "256,4,True" "256,4,True,gelu=True" "256,4,True,gelu=True,defer=True" "256,4,True,gelu=True,defer=2"; do python3 -c "$W T('f16',$cfg)" > /tmp/b.log 2>&1 & done; wait
timeout 420 python3 benchmarks/epilogue_pairs.py --shapes 4096,4096,4096 --shapes 8192,4096,4096 --shapes 8192,16384,4096 --rounds 16 \
  --contenders cublas,eager,persistent,persistent_gelu_poly,persistent_defer_gelu_poly,persistent_spread_gelu_poly > /tmp/pairs.log 2>&1; echo "pairs rc=$?"
find benchmarks/results -newer /tmp/stamp -type f -name "*.json" -exec cp {} $OUT/ \;
cp /tmp/pairs.log $OUT/pairs.log
grep -E "paired|error|WRONG" /tmp/pairs.log | tail -6
