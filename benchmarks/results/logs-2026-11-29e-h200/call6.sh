# Nsight Compute on the deferred-GELU experiment (its diff applied on the GPU machine only)
. benchmarks/device_setup.sh > /tmp/setup.log 2>&1; export PNEX_EXPECT_GPU=1; touch /tmp/stamp
nvidia-smi --query-gpu=name --format=csv,noheader
patch -p1 < benchmarks/results/logs-2026-11-29e-h200/deferred-gelu-experiment.diff > /tmp/patch.log || { cat /tmp/patch.log; exit 1; }
python3 - <<'PY'
p = 'benchmarks/gemm_ncu.py'; s = open(p).read()
old = '"pingpong-wide-gelu", "pingpong-wide-cluster")'
assert old in s
s = s.replace(old, '"pingpong-wide-gelu", "pingpong-wide-cluster", "tma-persistent-defer-gelu", "tma-persistent-spread-gelu")')
old = '        "tma-persistent-gelu": lambda: (TmaLinear(dtype, 256, 4, persistent=True, gelu=True), (a, w, bias)),\n'
assert old in s
s = s.replace(old, old + '        "tma-persistent-defer-gelu": lambda: (TmaLinear(dtype, 256, 4, persistent=True, gelu=True, defer=True), (a, w, bias)),\n'
              '        "tma-persistent-spread-gelu": lambda: (TmaLinear(dtype, 256, 4, persistent=True, gelu=True, defer=2), (a, w, bias)),\n')
open(p, 'w').write(s)
PY
W='import sys; sys.path.insert(0,"examples/tensor_cores"); from gemm_tma import TmaLinear as T;'
for cfg in "256,4,True" "256,4,True,gelu=True" "256,4,True,gelu=True,defer=True" "256,4,True,gelu=True,defer=2"; do python3 -c "$W T('f16',$cfg)" > /tmp/b.log 2>&1 & done; wait
timeout 450 python3 benchmarks/gemm_ncu.py --shapes 8192,4096,4096 --kernels tma-persistent,tma-persistent-gelu,tma-persistent-defer-gelu,tma-persistent-spread-gelu > /tmp/ncu.log 2>&1; echo "ncu rc=$?"
find benchmarks/results -newer /tmp/stamp -type f -name "gemm-ncu-*.json" -exec cp {} $OUT/ \;
cp /tmp/ncu.log $OUT/ncu.log
tail -40 /tmp/ncu.log
