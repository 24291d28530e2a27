"""Tensor cores from pnex kernels (issue 35): GEMMs and attention written as pnex kernels
with pnex.tc, against cuBLAS (torch.matmul), Triton and SDPA, on one GPU.

    python benchmarks/tensor_cores.py                # every row
    python benchmarks/tensor_cores.py --only gemm --shapes 4096,4096,4096

Prints a table and writes benchmarks/results/tensor-cores-<date>.json: ``gpu`` (the GPU's
name), ``gemm`` rows (dtype, m, n, k, pnex_tflops, cublas_tflops, triton_tflops,
ratio_vs_cublas, the pnex kernel that gave it, and every pnex variant timed),
``attention`` rows and ``epilogue`` rows (fused bias + GELU: the cp.async and TMA kernels
against eager PyTorch and torch.compile).  Every result is checked against a float64 reference first (relative
Frobenius error), on fresh random inputs; a wrong kernel is reported, never timed.  The contenders of a
row are then timed against one another, each once a round in a shuffled order
(``bench_common.interleaved_seconds``; one after another before 2026-11-28 night).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 1024, 4096)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["gemm", "attention", "epilogue", "profiles"], action="append",
                   help="run only these parts (repeatable); default: all; 'profiles' with --profile: the "
                        "profiles only")
    p.add_argument("--shapes", action="append", default=None,
                   help="GEMM shapes M,N,K (repeatable); default: 4096^3, 8192^3, 16384x1024x4096")
    p.add_argument("--dtypes", default="f16,bf16", help="GEMM dtypes, comma-separated (default f16,bf16)")
    p.add_argument("--variants", default=None,
                   help="pnex GEMM variants to time, e.g. 'mma:128x128x3,mma:128x64x4' (default: all known)")
    p.add_argument("--epilogue-shapes", action="append", default=None,
                   help="fused-epilogue shapes M,N,K (repeatable); default: 4096^3, 8192x4096x4096, 8192x16384x4096")
    p.add_argument("--epilogue-kernels", default=None,
                   help="fused-epilogue pnex kernels, comma-separated, of wgmma,tma,tma-cluster,tma-persistent,pingpong,pingpong-64x256 "
                        "(default: all)")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton baseline")
    p.add_argument("--repeats", type=int, default=10, help="timed repetitions (median), default 10")
    p.add_argument("--no-write", action="store_true", help="print only; write no results file")
    p.add_argument("--profile", action="store_true",
                   help="also run the GEMM kernels (TMA, persistent TMA, cp.async) and the attention kernel once "
                        "under Nsight Compute (pnex.profile): tensor-pipe use, speed of light, occupancy and the top stall "
                        "reasons go into the JSON")
    p.add_argument("--profile-only", action="append", default=None, metavar="NAME",
                   help="with --profile: only the kernels whose name contains NAME (repeatable), e.g. 'gelu'")
    return p.parse_args(argv)


def rel_error(out, ref) -> float:
    import torch

    return float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))


def checked_interleaved(baselines, candidates, args, ref, tolerance, repeats):
    """Each of ``candidates`` (name: ``build()`` giving the function) is compared with the
    float64 ``ref`` on ``args`` first; then the ``baselines`` (name: function) and the
    candidates within ``tolerance`` (relative Frobenius error) are timed against one another,
    each once in every one of ``2 * repeats`` rounds in a shuffled order
    (:func:`bench_common.interleaved_seconds`: on a power-capped card, timing one after
    another favours the first), 5 calls a timing, the median kept.  Returns
    ``({baseline: seconds}, {candidate: (error, seconds, note)})``: a wrong result or a
    failure is a note, never a time (one kernel failing must not lose the others' figures)."""
    from bench_common import interleaved_seconds

    live, checked = dict(baselines), {}
    for name, build in candidates.items():
        try:
            fn = build()
            err = rel_error(fn(*args), ref)
            if err < tolerance:
                live[name], checked[name] = fn, (err, None)
            else:
                checked[name] = (err, "WRONG RESULT: not timed")
        except Exception as exc:  # noqa: BLE001 - reported in the results, beside the other kernels' figures
            checked[name] = (None, f"{type(exc).__name__}: {str(exc)[:300]}")
    times = {name: statistics.median(t) for name, t in interleaved_seconds(live, args, 2 * repeats, 5).items()}
    return ({name: times[name] for name in baselines},
            {name: (err, times.get(name), note) for name, (err, note) in checked.items()})


def _timed(err, seconds, note, work):
    """A variant's entry: its error, its rate (``work`` / ``seconds``) and any note."""
    return {"error": err, "tflops": work / seconds / 1e12 if seconds else None, **({"note": note} if note else {})}


class Linear:
    """A wgmma kernel (``a @ w.T``) timed as ``a @ b``: ``w = b.T`` made contiguous once,
    outside the timing (the layout of torch.nn.Linear's weight; cuBLAS takes either)."""

    def __init__(self, op):
        self.op = op
        self._w = {}

    def __call__(self, a, b):
        key = (b.data_ptr(), tuple(b.shape))
        if key not in self._w:
            self._w = {key: b.t().contiguous()}
        return self.op(a, self._w[key])


def gemm_variants(selected):
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm
    from gemm_pingpong import PingPongLinear
    from gemm_tma import TmaLinear
    from gemm_wgmma import make_linear

    known = {
        # persistent, two consumer warpgroups taking turns on 128 x 128 tiles (<STAGES> buffers)
        "pingpong:128x128x5": lambda dt: Linear(PingPongLinear(dt, 5)),
        "pingpong:128x128x4": lambda dt: Linear(PingPongLinear(dt, 4)),
        "pingpong:64x256x4": lambda dt: Linear(PingPongLinear(dt, 4, tile=(64, 256))),
        "pingpong:64x256x3": lambda dt: Linear(PingPongLinear(dt, 3, tile=(64, 256))),
        "pingpong-cluster:128x128x5": lambda dt: Linear(PingPongLinear(dt, 5, cluster=2)),
        "pingpong-cluster:128x128x4": lambda dt: Linear(PingPongLinear(dt, 4, cluster=2)),
        "tma:128x256x4": lambda dt: Linear(TmaLinear(dt, 256, 4)),
        "tma:128x256x3": lambda dt: Linear(TmaLinear(dt, 256, 3)),
        "tma:128x128x6": lambda dt: Linear(TmaLinear(dt, 128, 6)),
        # 2-block clusters sharing W's tile by TMA multicast (BM 128 a block; <BN>x<STAGES>)
        "tma-cluster:256x4": lambda dt: Linear(TmaLinear(dt, 256, 4, cluster=2)),
        "tma-cluster:256x3": lambda dt: Linear(TmaLinear(dt, 256, 3, cluster=2)),
        "tma-cluster:128x6": lambda dt: Linear(TmaLinear(dt, 128, 6, cluster=2)),
        "tma-persistent:128x256x4": lambda dt: Linear(TmaLinear(dt, 256, 4, persistent=True)),
        "tma-persistent:128x256x3": lambda dt: Linear(TmaLinear(dt, 256, 3, persistent=True)),
        "tma-persistent:128x128x5": lambda dt: Linear(TmaLinear(dt, 128, 5, persistent=True)),
        "wgmma:128xTune": lambda dt: Linear(make_linear(dt, 128, (128, 256), (3, 4))),
        "wgmma:128x256x4": lambda dt: Linear(make_linear(dt, 128, 256, 4)),
        "wgmma:128x128x4": lambda dt: Linear(make_linear(dt, 128, 128, 4)),
        "wgmma:128x128x3": lambda dt: Linear(make_linear(dt, 128, 128, 3)),  # 96 KiB: two blocks an SM
        "wgmma:128x256x3": lambda dt: Linear(make_linear(dt, 128, 256, 3)),
        "wgmma:128x256x4-direct": lambda dt: Linear(make_linear(dt, 128, 256, 4, staged=False)),
        "mma:128x128x3": lambda dt: make_gemm(dt, 128, 128, 3),
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
            check = ref if ref is not None else torch.matmul(a, b).double()  # once per shape, not per variant
            tolerance = 2e-3 if dtype == "f16" else 1e-2
            baselines = {"cublas": torch.matmul, **({"triton": triton_mm} if triton_mm is not None else {})}
            base, checked = checked_interleaved(baselines, {name: lambda op=op: op for name, op in ops.items()},
                                                (a, b), check, tolerance, args.repeats)
            row = {"dtype": dtype, "m": m, "n": n, "k": k, "cublas_tflops": flops / base["cublas"] / 1e12,
                   "cublas_error": rel_error(torch.matmul(a, b), ref) if ref is not None else None,
                   "triton_tflops": flops / base["triton"] / 1e12 if "triton" in base else None}
            if triton_mm is not None:
                row["triton_error"] = rel_error(triton_mm(a, b), ref) if ref is not None else None
            timed = {name: _timed(*checked[name], flops) for name in ops}
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


ATTENTION_ROWS = [(4096, 16, 64, False), (4096, 16, 64, True), (4096, 16, 128, False), (4096, 16, 128, True)]


def run_attention(args, torch, result):
    """FlashAttention-2-style forward (examples/tensor_cores/attention.py) against SDPA's
    flash backend, batch 2 (FLOPs: 4 b h s^2 d, halved when causal)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from attention import make_attention

    rows = []
    batch = 2
    for seq, heads, dim, causal in ATTENTION_ROWS:
        dtype = "f16"
        flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
        gen = torch.Generator(device="cuda").manual_seed(seq + dim + causal)
        q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16, generator=gen)
                   for _ in range(3))
        scale = dim ** -0.5

        def sdpa(q, k, v, scale):  # the pnex op's arguments: both are timed on the same ones
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        ref = sdpa(q, k, v, scale)
        builds = {f"fa2:{warps}w": (lambda warps=warps: make_attention(dtype, dim, causal, warps)) for warps in (4, 8)}
        base, checked = checked_interleaved({"sdpa": sdpa}, builds, (q, k, v, scale), ref.double(), 5e-3,
                                            args.repeats)
        row = {"seq": seq, "heads": heads, "batch": batch, "head_dim": dim, "causal": causal, "dtype": dtype,
               "sdpa_tflops": flops / base["sdpa"] / 1e12}
        variants = {name: _timed(*checked[name], flops) for name in builds}
        best = max((v["tflops"] or 0, name) for name, v in variants.items())
        row.update(pnex_tflops=best[0] or None, pnex_kernel=best[1] if best[0] else None, pnex_variants=variants)
        row["ratio_vs_sdpa"] = row["pnex_tflops"] / row["sdpa_tflops"] if row["pnex_tflops"] else None
        rows.append(row)
        print(f"attention seq {seq} heads {heads} d {dim} causal {causal}: SDPA {row['sdpa_tflops']:.0f} TFLOP/s, "
              f"pnex {row['pnex_tflops'] or 0:.0f} ({row['pnex_kernel']}) = {row['ratio_vs_sdpa'] or 0:.2f}x; "
              + ", ".join(f"{k2} {v['tflops'] or 0:.0f}" + (f" [{v.get('note')}]" if v.get("note") else "")
                          for k2, v in variants.items()), flush=True)
    result["attention"] = rows


EPILOGUE_SHAPES = [(4096, 4096, 4096), (8192, 4096, 4096), (8192, 16384, 4096)]


def run_epilogue(args, torch, result):
    """gelu(x @ w.T + b) fused into the epilogue of the cp.async wgmma kernel
    (``pnex_us``), of the TMA kernel (``pnex_tma_us``; in 2-block clusters sharing W by
    multicast, ``pnex_tma_cluster_us``; persistent, ``pnex_tma_persistent_us``: both since
    2026-11-28 late) and of the ping-pong kernel
    (``pnex_pingpong_us``: the epilogue under the other warpgroup's k-loop; 128 x 128
    tiles, and ``pnex_pingpong_64x256_us``), against
    eager PyTorch (F.linear, then F.gelu) and torch.compile of the same function; the
    ratios are the fastest pnex kernel's (``pnex_kernel``: "wgmma", "tma", "tma-cluster",
    "tma-persistent", "pingpong" or "pingpong-64x256").  The TMA and ping-pong kernels' GELU is
    :func:`epilogue.gelu_poly` (since 2026-11-28 night; the erf form before), the cp.async
    kernel's the erf form.  Every contender is timed in each of ``2 * repeats`` rounds, in a
    shuffled order (since the same date; one after another before).  A kernel whose result is
    wrong is reported, not timed."""
    import torch.nn.functional as F

    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_pingpong import PingPongLinear
    from gemm_tma import TmaLinear
    from gemm_wgmma import make_linear

    def eager(x, w, b):
        return F.gelu(F.linear(x, w, b))

    compiled = torch.compile(eager, fullgraph=True)
    kernels = {"wgmma": ("pnex", make_linear("f16", 128, (128, 256), (3, 4), gelu=True)),
               "tma": ("pnex_tma", TmaLinear("f16", 256, 4, gelu=True)),
               "tma-cluster": ("pnex_tma_cluster", TmaLinear("f16", 256, 4, cluster=2, gelu=True)),
               "tma-persistent": ("pnex_tma_persistent", TmaLinear("f16", 256, 4, persistent=True, gelu=True)),
               "pingpong": ("pnex_pingpong", PingPongLinear("f16", 5, gelu=True)),
               "pingpong-64x256": ("pnex_pingpong_64x256", PingPongLinear("f16", 4, gelu=True, tile=(64, 256)))}
    if args.epilogue_kernels:
        kernels = {name: kernels[name] for name in args.epilogue_kernels.split(",")}
    shapes = ([tuple(int(x) for x in s.split(",")) for s in args.epilogue_shapes] if args.epilogue_shapes
              else EPILOGUE_SHAPES)
    rows = []
    for m, n, k in shapes:
        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16, generator=gen)
        ref = F.gelu(x.double() @ w.double().t() + b.double())
        row = {"m": m, "n": n, "k": k, "eager_error": rel_error(eager(x, w, b), ref),
               "compile_error": rel_error(compiled(x, w, b), ref)}
        base, checked = checked_interleaved({"eager": eager, "compile": compiled},
                                            {key: (lambda op=op: op) for key, op in kernels.values()},
                                            (x, w, b), ref, 2e-3, args.repeats)
        row["eager_us"], row["compile_us"] = base["eager"] * 1e6, base["compile"] * 1e6
        for key, (err, seconds, note) in checked.items():
            row[f"{key}_error"], row[f"{key}_us"] = err, seconds * 1e6 if seconds else None
            if note:
                row[f"{key}_note"] = note
        timed = [(row[f"{key}_us"], kernel) for kernel, (key, _) in kernels.items() if row[f"{key}_us"]]
        best_us, row["pnex_kernel"] = min(timed) if timed else (None, None)
        row["pnex_vs_eager"] = row["eager_us"] / best_us if best_us else None
        row["pnex_vs_compile"] = row["compile_us"] / best_us if best_us else None
        rows.append(row)
        timings = ", ".join(f"{kernel} {_us(row[f'{key}_us'])}" for kernel, (key, _) in kernels.items())
        errors = " / ".join(f"{row.get(f'{key}_error') or 0:.1e}" for key, _ in kernels.values())
        notes = "".join(f" [{key}: {row[key + '_note']}]" for key, _ in kernels.values() if key + "_note" in row)
        print(f"epilogue {m}x{n}x{k}: pnex {timings} us, eager {row['eager_us']:.1f}, torch.compile "
              f"{row['compile_us']:.1f}: {row['pnex_vs_eager'] or 0:.3f}x / {row['pnex_vs_compile'] or 0:.3f}x the speed "
              f"({row['pnex_kernel']}; errors {errors} / eager {row['eager_error']:.1e}){notes}", flush=True)
    result["epilogue"] = rows


def _us(value):
    return f"{value:.1f}" if value else "-"


def _profile_row(name, op, args):
    """Nsight Compute's figures of one launch of ``op(*args)`` (pnex.profile), as plain data."""
    import pnex_magic as pnex

    try:
        p = pnex.profile(op, *args)
    except Exception as exc:  # noqa: BLE001 - no ncu, or no counters: say so in the results
        return {"kernel": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    f = p.figures
    if f is None:
        return {"kernel": name, "error": p.note}
    row = {"kernel": name, "tensor_pipe": f.tensor_pipe, "compute_sol": f.compute_sol, "memory_sol": f.memory_sol,
           "dram_sol": f.dram_sol, "achieved_occupancy": f.achieved_occupancy, "issuing": f.issuing,
           "stalls": [(s.name, round(s.share, 3)) for s in f.stalls[:5]], "stall_source": f.stall_source,
           "hot_lines": [(h.line, h.text, round(h.share, 3), h.reason) for h in p.hot_lines[:5]],
           "note": p.note or None}
    print(f"profile {name}: tensor pipe {f.tensor_pipe}, SM {f.compute_sol}, memory {f.memory_sol}, occupancy "
          f"{f.achieved_occupancy}, issuing {f.issuing}; stalls {row['stalls']}", flush=True)
    return row


def run_profiles(result, torch, only=None):
    """The pnex GEMMs (float16, 4096^3: the TMA kernel, plain, persistent and with the
    GELU epilogue, the ping-pong one plain and with the GELU epilogue, and the cp.async
    one) and the attention kernel (head_dim 128) under ncu; ``only``: the names that
    contain one of these strings."""
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from attention import make_attention
    from gemm_pingpong import PingPongLinear
    from gemm_tma import BK, BM, TmaLinear, _sm_count
    from gemm_wgmma import make_linear

    from pnex_magic import tc

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64
    bias = torch.randn(4096, device="cuda", dtype=torch.float16)
    maps = (tc.tensor_map(a, (BM, BK)), tc.tensor_map(w, (256, BK)))
    maps128 = (tc.tensor_map(a, (BM, BK)), tc.tensor_map(w, (128, BK)))
    sms = _sm_count(a.device)
    tiles = (a.shape[0] // BM) * (w.shape[0] // 256)
    q, k, v = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    kernels = {
        "tma 128x256, 4 stages": lambda: (TmaLinear("f16", 256, 4).op, (a, w, *maps)),
        "tma persistent 128x256, 4 stages": lambda: (TmaLinear("f16", 256, 4, persistent=True).op,
                                                     (a, w, *maps, min(tiles, sms))),
        "tma gelu 128x256, 4 stages": lambda: (TmaLinear("f16", 256, 4, gelu=True).op, (a, w, bias, *maps)),
        "pingpong 128x128, 5 stages": lambda: (PingPongLinear("f16", 5).op, (a, w, *maps128, sms)),
        "pingpong gelu 128x128, 5 stages": lambda: (PingPongLinear("f16", 5, gelu=True).op,
                                                    (a, w, bias, *maps128, sms)),
        "wgmma 128x256, 4 stages": lambda: (make_linear("f16", 128, 256, 4), (a, w)),
        "attention d128, 8 warps": lambda: (make_attention("f16", 128, False, 8), (q, k, v, 128 ** -0.5)),
    }
    rows = []
    for name, make in kernels.items():
        if not only or any(o in name for o in only):
            rows.append(_profile_row(name, *make()))
    result["profiles"] = rows


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
    for name, run in (("gemm", run_gemm), ("attention", run_attention), ("epilogue", run_epilogue)):
        if name in parts:
            try:
                run(args, torch, result)
            except Exception as exc:  # noqa: BLE001 - one part failing must not lose the others' rows
                import traceback

                traceback.print_exc()
                result[f"{name}_failed"] = f"{type(exc).__name__}: {exc}"
    if args.profile:
        try:
            run_profiles(result, torch, args.profile_only)
        except Exception as exc:  # noqa: BLE001
            result["profiles_failed"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.perf_counter() - start
    print()
    print(f"{'dtype':6} {'m':>6} {'n':>6} {'k':>6} {'pnex':>7} {'cuBLAS':>7} {'Triton':>7} {'ratio':>6}  kernel")
    for r in result.get("gemm", []):
        print(f"{r['dtype']:6} {r['m']:6} {r['n']:6} {r['k']:6} {r['pnex_tflops'] or 0:7.0f} {r['cublas_tflops']:7.0f} "
              f"{r['triton_tflops'] or 0:7.0f} {r['ratio_vs_cublas'] or 0:6.2f}  {r['pnex_kernel']}")
    for r in result.get("attention", []):
        print(f"attention seq {r['seq']} d {r['head_dim']} causal {r['causal']!s:5}: pnex {r['pnex_tflops'] or 0:.0f} "
              f"SDPA {r['sdpa_tflops']:.0f} TFLOP/s ratio {r['ratio_vs_sdpa'] or 0:.2f} ({r['pnex_kernel']})")
    for r in result.get("epilogue", []):
        pnex = ", ".join(f"{key[5:-3] or 'cp.async'} {_us(v)}" for key, v in r.items()
                         if key.startswith("pnex") and key.endswith("_us"))
        print(f"epilogue {r['m']}x{r['n']}x{r['k']}: pnex {pnex} us, eager {r['eager_us']:.1f}, compile "
              f"{r['compile_us']:.1f} (fastest pnex: {r['pnex_kernel']})")
    if not args.no_write:
        print("wrote", write_result(result, "tensor-cores"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
