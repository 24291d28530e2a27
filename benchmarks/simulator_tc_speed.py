"""How fast the CUDA simulator runs the tensor-core examples at notebook 07's CPU sizes.

Notebook 07 (``notebooks/07_tensor_cores.ipynb``) runs, on a machine without an sm_90
GPU, its kernels in numba-cuda's simulator (one Python thread per CUDA thread, warp-level
instructions met at a rendezvous of the warp's lanes: :mod:`pnex_magic.tc.rendezvous`):
the wgmma GEMM (128 x 128 x 128, 256 threads), the same with a fused bias + GELU, and
FlashAttention forward (``examples/tensor_cores/attention.py``, seq 128) at head_dim 64
(4 warps) and 128 (8 warps), causal or not.  Per op: the time to define it (the GPU
compile that checks it, or the compile cache), its first call (for pnex's typed
simulator: the rewrite and Numba's typing of the kernel, then the launch), the median of
``--repeats`` further calls (the launch alone), and the SHA-256 of its output, which must
not change from one checkout to another (the simulator's speed is not allowed to change
a result).

    python benchmarks/simulator_tc_speed.py                 # every op
    python benchmarks/simulator_tc_speed.py --only attention-d64-causal --repeats 1

Runs on any checkout (``git worktree`` of main for a "before"); no GPU needed.  Writes
``benchmarks/results/simulator-tc-speed-<date>.json``.
"""

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ("linear", "linear-gelu", "attention-d64", "attention-d64-causal", "attention-d128", "attention-d128-causal")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="simulator_tc_speed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the first (median kept)")
    parser.add_argument("--only", choices=OPS, action="append", help="run only these ops")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    return parser.parse_args()


def _make(name: str):
    """(a function that defines the op, its arguments), at notebook 07's CPU sizes."""
    import torch

    g = torch.Generator().manual_seed(0)
    if name.startswith("linear"):
        from gemm_wgmma import make_linear

        a = torch.randn(128, 128, generator=g, dtype=torch.float16)
        w = torch.randn(128, 128, generator=g, dtype=torch.float16) / 128 ** 0.5
        if name == "linear":
            return (lambda: make_linear("f16", 128, 128, 3)), (a, w)
        bias = torch.randn(128, generator=g, dtype=torch.float16)
        return (lambda: make_linear("f16", 128, 128, 3, gelu=True)), (a, w, bias)
    from attention import make_attention

    d = 128 if "d128" in name else 64
    causal = name.endswith("causal")
    q, k, v = (torch.randn(1, 1, 128, d, generator=g, dtype=torch.float16) for _ in range(3))
    return (lambda: make_attention("f16", d, causal, 4 if d == 64 else 8)), (q, k, v, d ** -0.5)


def main() -> int:
    args = _parse()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(ROOT / "examples" / "tensor_cores"))
    import bench_common

    rows = []
    print(f"{'op':22s} {'define s':>9s} {'first call s':>13s} {'launch s':>9s}  output sha256")
    for name in args.only or OPS:
        define, op_args = _make(name)
        start = time.perf_counter()
        op = define()
        defined = time.perf_counter() - start
        start = time.perf_counter()
        out = op(*op_args)
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            again = op(*op_args)
            times.append(time.perf_counter() - start)
            if not bool((again == out).all()):
                raise SystemExit(f"{name}: two calls on the same inputs gave different outputs")
        digest = hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest()
        launch = statistics.median(times) if times else float("nan")
        rows.append({"op": name, "define_s": defined, "first_call_s": first, "launch_s": launch, "all_launch_s": times,
                     "sha256": digest})
        print(f"{name:22s} {defined:9.1f} {first:13.1f} {launch:9.2f}  {digest[:16]}", flush=True)
    if not args.no_write:
        result = {**bench_common.cpu_header("simulator-tc-speed"), "repeats": args.repeats, "rows": rows}
        print("wrote", bench_common.write_result(result, "simulator-tc-speed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
