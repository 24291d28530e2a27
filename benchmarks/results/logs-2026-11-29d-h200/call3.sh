. benchmarks/device_setup.sh > /tmp/setup.log 2>&1; export PNEX_EXPECT_GPU=1; touch /tmp/stamp
nvidia-smi --query-gpu=name --format=csv,noheader
W='import sys; sys.path.insert(0,"examples/tensor_cores"); from gemm_tma import TmaLinear as T;'
start=$SECONDS
cfgs=("256,4,True" "256,4,True,gelu=True" "256,4,True,gelu=True,overlap=1" "128,6,True" "128,6,True,gelu=True" "128,6,True,gelu=True,overlap=1" "128,6,True,gelu=True,overlap=2,pieces=2" "128,6,True,gelu=True,overlap=2,pieces=1")
i=0; for cfg in "${cfgs[@]}"; do i=$((i+1)); (python3 -c "$W T('f16',$cfg)" > $OUT/build$i.log 2>&1; echo "built $cfg rc=$? at $((SECONDS-start))s") & done; wait
timeout 120 python3 -m pytest -q -m gpu tests/test_tc_bulk_gpu.py -k overlapped -p no:cacheprovider --tb=short -rfE > $OUT/gputest.log 2>&1; echo "gputest rc=$? at $((SECONDS-start))s"; tail -3 $OUT/gputest.log
timeout 300 python3 benchmarks/epilogue_pairs.py --shapes 4096,4096,4096 --shapes 8192,4096,4096 --shapes 8192,16384,4096 --rounds 10 \
  --contenders cublas,eager,compile,persistent,persistent_gelu_poly,persistent_ov1_gelu_poly,persistent128,persistent128_gelu_poly,persistent128_ov1_gelu_poly,persistent128_ov2p2_gelu_poly,persistent128_ov2p1_gelu_poly > $OUT/pairs.log 2>&1; echo "pairs rc=$? at $((SECONDS-start))s"
find benchmarks/results -newer /tmp/stamp -type f -name "*.json" -exec cp {} $OUT/ \;
tail -32 $OUT/pairs.log
