"""Tensor cores from pnex kernels (issue 35): GEMMs and attention written as pnex kernels
with pnex.tc, against cuBLAS (torch.matmul), Triton and SDPA, on one GPU.

    python benchmarks/tensor_cores.py                # every row
    python benchmarks/tensor_cores.py --only gemm --shapes 4096,4096,4096

Prints a table and writes benchmarks/results/tensor-cores-<date>.json: ``gpu`` (the GPU's
name), ``gemm`` rows (dtype, m, n, k, pnex_tflops, cublas_tflops, triton_tflops,
ratio_vs_cublas, the pnex kernel that gave it, and every pnex variant timed) and
``attention`` rows.  Every result is checked against a float64 reference first (relative
Frobenius error), on fresh random inputs; a wrong kernel is reported, never timed.
"""

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["gemm", "attention", "epilogue"], action="append",
                   help="run only these parts (repeatable); default: all")
    p.add_argument("--shapes", action="append", default=None,
                   help="GEMM shapes M,N,K (repeatable); default: 4096^3, 8192^3, 16384x1024x4096")
    p.add_argument("--dtypes", default="f16,bf16", help="GEMM dtypes, comma-separated (default f16,bf16)")
    p.add_argument("--variants", default=None,
                   help="pnex GEMM variants to time, e.g. 'mma:128x128x3,mma:128x64x4' (default: all known)")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton baseline")
    p.add_argument("--repeats", type=int, default=10, help="timed repetitions (median), default 10")
    p.add_argument("--no-write", action="store_true", help="print only; write no results file")
    return p.parse_args(argv)


def rel_error(out, ref) -> float:
    import torch

    return float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))


def time_call(fn, args, repeats):
    from bench_common import queued_seconds

    return queued_seconds(fn, args, loops=5, repeats=repeats)


def gemm_variants(selected):
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    known = {
        "mma:128x128x3": lambda dt: make_gemm(dt, 128, 128, 3),
        "mma:128x64x4": lambda dt: make_gemm(dt, 128, 64, 4),
        "mma:64x128x4": lambda dt: make_gemm(dt, 64, 128, 4),
    }
    names = selected.split(",") if selected else list(known)
    return {n: known[n] for n in names}


def run_gemm(args, torch, result):
    variants = gemm_variants(args.variants)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else GEMM_SHAPES
    triton_mm = None
    if not args.no_triton:
        try:
            sys.path.insert(0, str(HERE))
            from triton_baselines import matmul as triton_mm
        except Exception as exc:  # noqa: BLE001
            print(f"Triton baseline unavailable: {type(exc).__name__}: {exc}")
    rows = []
    for dtype in args.dtypes.split(","):
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        ops = {name: make(dtype) for name, make in variants.items()}
        for m, n, k in shapes:
            flops = 2 * m * n * k
            gen = torch.Generator(device="cuda").manual_seed(m + 3 * n + 7 * k)
            a = torch.randn(m, k, device="cuda", dtype=tdt, generator=gen)
            b = torch.randn(k, n, device="cuda", dtype=tdt, generator=gen)
            ref = (a.double() @ b.double()) if m * n * k <= 4096 ** 3 else None
            cublas = time_call(torch.matmul, (a, b), args.repeats)
            row = {"dtype": dtype, "m": m, "n": n, "k": k, "cublas_tflops": flops / cublas / 1e12,
                   "cublas_error": rel_error(torch.matmul(a, b), ref) if ref is not None else None}
            if triton_mm is not None:
                out = triton_mm(a, b)
                row["triton_error"] = rel_error(out, ref) if ref is not None else None
                row["triton_tflops"] = flops / time_call(triton_mm, (a, b), args.repeats) / 1e12
            else:
                row["triton_tflops"] = None
            timed = {}
            for name, op in ops.items():
                try:
                    out = op(a, b)
                    err = rel_error(out, ref if ref is not None else torch.matmul(a, b).double())
                    if not err < (2e-3 if dtype == "f16" else 1e-2):
                        timed[name] = {"error": err, "tflops": None, "note": "WRONG RESULT: not timed"}
                        continue
                    seconds = time_call(op, (a, b), args.repeats)
                    timed[name] = {"error": err, "tflops": flops / seconds / 1e12}
                except Exception as exc:  # noqa: BLE001
                    timed[name] = {"error": None, "tflops": None, "note": f"{type(exc).__name__}: {str(exc)[:300]}"}
            best = max((v["tflops"] or 0, name) for name, v in timed.items())
            row.update(pnex_tflops=best[0] or None, pnex_kernel=best[1] if best[0] else None, pnex_variants=timed)
            row["ratio_vs_cublas"] = (row["pnex_tflops"] / row["cublas_tflops"]) if row["pnex_tflops"] else None
            rows.append(row)
            print(f"gemm {dtype} {m}x{n}x{k}: cuBLAS {row['cublas_tflops']:.0f} TFLOP/s, "
                  f"Triton {row['triton_tflops'] or 0:.0f}, pnex {row['pnex_tflops'] or 0:.0f} ({row['pnex_kernel']}) "
                  f"= {row['ratio_vs_cublas'] or 0:.2f}x; variants: "
                  + ", ".join(f"{k2} {v['tflops'] or 0:.0f}" + (f" [{v.get('note')}]" if v.get('note') else "")
                              for k2, v in timed.items()), flush=True)
    result["gemm"] = rows


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("tensor_cores.py needs an NVIDIA GPU (sm_80 or newer): torch.cuda.is_available() is False")
        return 2
    sys.path.insert(0, str(HERE))
    from bench_common import launcher_ready, result_header, write_result

    print("launcher:", launcher_ready())
    result = result_header("tensor-cores")
    result["gpu_info"] = result["gpu"]
    result["gpu"] = result["gpu_info"]["name"]
    parts = args.only or ["gemm", "attention", "epilogue"]
    start = time.perf_counter()
    if "gemm" in parts:
        run_gemm(args, torch, result)
    result["seconds"] = time.perf_counter() - start
    print()
    print(f"{'dtype':6} {'m':>6} {'n':>6} {'k':>6} {'pnex':>7} {'cuBLAS':>7} {'Triton':>7} {'ratio':>6}  kernel")
    for r in result.get("gemm", []):
        print(f"{r['dtype']:6} {r['m']:6} {r['n']:6} {r['k']:6} {r['pnex_tflops'] or 0:7.0f} {r['cublas_tflops']:7.0f} "
              f"{r['triton_tflops'] or 0:7.0f} {r['ratio_vs_cublas'] or 0:6.2f}  {r['pnex_kernel']}")
    if not args.no_write:
        print("wrote", write_result(result, "tensor-cores"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
