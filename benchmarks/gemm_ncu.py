"""cuBLAS's GEMM kernel and pnex's beside it under Nsight Compute, one launch each, the
same shape and the same clocks: where the pnex kernels lose their last 5-15% (issue 35).

    python benchmarks/gemm_ncu.py                        # float16 4096^3 and 8192^3
    python benchmarks/gemm_ncu.py --shapes 4096,4096,4096 --kernels tma,tma-persistent

The script runs itself under ``ncu --set full --clock-control base`` (the clocks locked to
the base clock, so a power-capped card cannot favour either kernel) with profiling
started only around one call of each contender (``torch.cuda.profiler``), after every
kernel is compiled and warmed up.  For each kernel it prints and keeps: its name (cuBLAS's
names its tile, cluster and schedule), duration, tensor-pipe use, SM and memory speed of
light, L2 hit rate, shared-memory pipe use, registers, shared memory and grid, and the top
stall reasons (sampled warp states: pnex_magic.ncu).  Writes
benchmarks/results/gemm-ncu-<date>.json.  Needs a GPU and ``ncu`` (pnex_magic.ncu.find_ncu).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KERNELS = ("cublas", "cublas-linear", "tma", "tma-persistent", "tma-cluster", "pingpong", "tma-persistent-gelu",
           "tma-persistent-bias", "pingpong-gelu", "pingpong-wide", "pingpong-wide-gelu", "pingpong-wide-cluster")
#: The raw metrics kept beside pnex_magic.ncu.figures' (absent ones are left out).
EXTRA = {
    "l2_hit_rate": "lts__t_sector_hit_rate.pct",
    "shared_pipe": "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "registers": "launch__registers_per_thread",
    "shared_bytes": "launch__shared_mem_per_block",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "cluster": "launch__cluster_dim_x",
    "sm_mhz": "sm__cycles_elapsed.avg.per_second",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", action="append", default=None,
                   help="M,N,K (repeatable); default: 4096^3 and 8192^3")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help=f"comma-separated, of {', '.join(KERNELS)} (default: all); 'cublas' is a @ b, "
                        "'cublas-linear' a @ w.T (torch.nn.functional.linear, the pnex kernels' layout)")
    p.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)  # the profiled child
    p.add_argument("--no-write", action="store_true", help="print only; write no results file")
    return p.parse_args(argv)


def _contenders(names, m, n, k, dtype, torch):
    """``{name: (fn, args)}``: the kernels to profile at one shape."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_pingpong import PingPongLinear
    from gemm_tma import TmaLinear

    dt = torch.float16 if dtype == "f16" else torch.bfloat16
    a = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt) / k ** 0.5
    b = w.t().contiguous()
    bias = torch.randn(n, device="cuda", dtype=dt)
    make = {
        "cublas": lambda: (torch.matmul, (a, b)),
        "cublas-linear": lambda: (torch.nn.functional.linear, (a, w)),
        "tma": lambda: (TmaLinear(dtype, 256, 4), (a, w)),
        "tma-persistent": lambda: (TmaLinear(dtype, 256, 4, persistent=True), (a, w)),
        "tma-cluster": lambda: (TmaLinear(dtype, 256, 4, cluster=2), (a, w)),
        "pingpong": lambda: (PingPongLinear(dtype, 5), (a, w)),
        # the fused epilogues: bias + gelu_poly, and the bias alone
        "tma-persistent-gelu": lambda: (TmaLinear(dtype, 256, 4, persistent=True, gelu=True), (a, w, bias)),
        "tma-persistent-bias": lambda: (TmaLinear(dtype, 256, 4, persistent=True, gelu=True, activation="bias"),
                                        (a, w, bias)),
        "pingpong-gelu": lambda: (PingPongLinear(dtype, 5, gelu=True), (a, w, bias)),
        # the ping-pong kernel with a warpgroup's tile 64 x 256: plain, fused, in 2-block clusters
        "pingpong-wide": lambda: (PingPongLinear(dtype, 4, tile=(64, 256)), (a, w)),
        "pingpong-wide-gelu": lambda: (PingPongLinear(dtype, 4, gelu=True, tile=(64, 256)), (a, w, bias)),
        "pingpong-wide-cluster": lambda: (PingPongLinear(dtype, 4, tile=(64, 256), cluster=2), (a, w)),
    }
    return {name: make[name]() for name in names}


def target(args):
    """The profiled program: warm every contender up, then one call each between
    ``cudaProfilerStart`` and ``cudaProfilerStop``, in the order given; prints the order."""
    import torch

    order = []
    for shape in args.shapes:
        m, n, k = shape
        for name, (fn, fargs) in _contenders(args.kernels, m, n, k, args.dtype, torch).items():
            for _ in range(3):
                fn(*fargs)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            fn(*fargs)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            order.append((name, m, n, k))
    print("ORDER " + json.dumps(order), flush=True)
    return 0


def _row(kernel, name, shape):
    from pnex_magic.ncu import figures

    f = figures(kernel)
    row = {"contender": name, "m": shape[0], "n": shape[1], "k": shape[2], "kernel": kernel.name,
           "us": f.duration * 1e6 if f.duration else None, "tensor_pipe": f.tensor_pipe,
           "compute_sol": f.compute_sol, "memory_sol": f.memory_sol, "dram_sol": f.dram_sol,
           "issuing": f.issuing, "stalls": [(s.name, round(s.share, 3)) for s in f.stalls[:6]]}
    for key, metric in EXTRA.items():
        value = kernel.metric(metric)
        if value is not None:
            row[key] = value
    return row


def main(argv=None):
    args = parse_args(argv)
    args.shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shapes or ["4096,4096,4096", "8192,8192,8192"])]
    args.kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown:
        print(f"gemm_ncu.py: unknown kernels {unknown}; choose from {', '.join(KERNELS)}")
        return 2
    if args.target:
        return target(args)
    import torch

    if not torch.cuda.is_available():
        print("gemm_ncu.py needs an NVIDIA GPU (sm_90: the pnex kernels are Hopper's): torch.cuda.is_available() "
              "is False")
        return 2
    from pnex_magic.ncu import NCU_ADVICE, find_ncu, parse_raw

    ncu = find_ncu()
    if ncu is None:
        print(NCU_ADVICE)
        return 2
    sys.path.insert(0, str(HERE))
    from bench_common import result_header, write_result

    child = [sys.executable, str(Path(__file__).resolve()), "--target", "--dtype", args.dtype,
             "--kernels", ",".join(args.kernels)] + [a for s in args.shapes for a in ("--shapes", ",".join(map(str, s)))]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "gemm.ncu-rep")
        run = subprocess.run([ncu, "--target-processes", "all", "--profile-from-start", "off", "--set", "full",
                              "--clock-control", "base", "-f", "-o", report] + child,
                             capture_output=True, text=True)
        order_lines = [line for line in run.stdout.splitlines() if line.startswith("ORDER ")]
        if run.returncode or not order_lines:
            print(run.stdout[-3000:], run.stderr[-3000:])
            return 1
        order = json.loads(order_lines[-1][6:])
        raw = subprocess.run([ncu, "--import", report, "--page", "raw", "--csv", "--print-units", "base"],
                             capture_output=True, text=True, check=True).stdout
    kernels = parse_raw(raw)
    if len(kernels) != len(order):  # cuBLAS may launch more than one kernel (split-K's reduction)
        print(f"note: {len(kernels)} kernels profiled for {len(order)} calls; rows keep the launch order")
    result = result_header("gemm-ncu")
    result["gpu_info"] = result["gpu"]
    result["gpu"] = result["gpu_info"]["name"]
    result["method"] = ("ncu --set full --clock-control base, one call of each contender after 3 warm-up calls, "
                        f"{args.dtype}")
    rows = [_row(kern, name, (m, n, k)) for kern, (name, m, n, k) in zip(kernels, order)]
    result["rows"] = rows
    print(f"{'contender':15} {'shape':>16} {'us':>8} {'tensor':>7} {'SM':>5} {'mem':>5} {'L2hit':>6} {'smem':>5} "
          f"{'regs':>5} {'grid':>6}  top stalls / kernel")
    for r in rows:
        def pct(x):
            return f"{100 * x:4.0f}%" if x is not None else "    -"
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        print(f"{r['contender']:15} {shape:>16} {r['us'] or 0:8.1f} {pct(r['tensor_pipe']):>7} {pct(r['compute_sol'])} "
              f"{pct(r['memory_sol'])} {r.get('l2_hit_rate', 0):5.0f}% {r.get('shared_pipe', 0):4.0f}% "
              f"{r.get('registers', 0):5.0f} {r.get('grid', 0):6.0f}  {r['stalls'][:3]}")
        print(f"{'':15} {r['kernel'][:110]}")
    if not args.no_write:
        print("wrote", write_result(result, "gemm-ncu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
