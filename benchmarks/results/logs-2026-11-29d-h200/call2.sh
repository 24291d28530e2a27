. benchmarks/device_setup.sh > /tmp/setup.log 2>&1; export PNEX_EXPECT_GPU=1; touch /tmp/stamp
D=benchmarks/results/logs-2026-11-29d-h200
nvidia-smi --query-gpu=name --format=csv,noheader
W='import sys; sys.path.insert(0,"examples/tensor_cores"); from gemm_tma import TmaLinear as T;'
start=$SECONDS
cfgs=("128,6,True,gelu=True" "128,6,True,gelu=True,overlap=1" "128,6,True,gelu=True,overlap=2,pieces=1" "128,6,True,gelu=True,overlap=2,pieces=2" "128,6,True,gelu=True,overlap=2" "256,4,True,gelu=True,overlap=1" "128,6,True")
i=0; for cfg in "${cfgs[@]}"; do i=$((i+1)); (python3 -c "$W T('f16',$cfg)" > $OUT/build$i.log 2>&1; echo "built $cfg rc=$? at $((SECONDS-start))s") & done; wait
for cfg in "${cfgs[@]}"; do timeout 30 python3 $D/check_one.py "$cfg" 2>&1 | grep -v Warn | tail -6; echo "rc=${PIPESTATUS[0]} $cfg"; done
