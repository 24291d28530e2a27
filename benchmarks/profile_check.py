"""``pnex.profile`` on a GPU: three kernels under Nsight Compute, their figures, the time a
profile takes, and ncu's raw CSV kept as test fixtures; and the compute roofline's peak
against torch.matmul.

    python benchmarks/profile_check.py             # on the GPU machine (ncu installed)
    python benchmarks/profile_check.py --n 1e6     # smaller inputs

The kernels:

* **gather**: the cell of ``tests/fixtures/ncu/make_layout_fixture.py`` (compiled from the
  same file name and lines, so that its recording is a drop-in fixture): each thread
  loads an index, then the element it names; memory latency (long_scoreboard) expected;
* **copy**: one element per thread; memory-bound, near the memory's speed of light;
* **fma**: 256 dependent FMAs per element in a loop; compute-bound (wait, math pipe).

For each, ``pnex.profile`` runs once (one launch, ``--clock-control none``), and the script
prints its speed-of-light figures, occupancy, top stalls and hottest lines, and how long
the whole profile took (ncu's start, the child, every pass).  Each kernel's ncu output is
written as ``<kernel>-<gpu>-raw.csv`` and ``<kernel>-<gpu>-source.csv`` (into
``benchmarks/results/ncu-<date>/`` and ``$OUT/ncu/``): copy the gather pair into
``tests/fixtures/ncu/`` and ``tests/test_profile.py`` reads it as a real recording.

The roofline check: ``torch.matmul`` of two 8192x8192 bf16 matrices, TFLOP/s against
pnex's FP16/BF16 tensor-core peak (:func:`pnex_magic.hardware.peak_flops`: FLOP per clock
per SM x SMs x the SMs' maximum clock); and the naive pnex matmul's report (``flops=``)
against the FP32 peak.  A table last, and JSON in ``benchmarks/results/profile-check-<date>.json``.
"""

# No `from __future__ import annotations`: the kernel annotations below must be evaluated where written.

import argparse
import linecache
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CELL = "/tmp/ipykernel_2211/1733263541.py"
CELL_SOURCE = '''
def gather_scale(a: In("f32", (None,)), idx: In("i64", "a"), s: Scalar("f32"), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        j = idx[i]
        r[i] = a[j] * s
'''


def kernels():
    import pnex_magic as pnex
    from numba import cuda, float32

    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), CELL)
    ns = {"cuda": cuda, "In": pnex.In, "Scalar": pnex.Scalar, "Out": pnex.Out}
    exec(compile(CELL_SOURCE, CELL, "exec"), ns)  # noqa: S102 - the fixture's cell, under its own file name
    gather = pnex.jit(n_threads="a.numel()")(ns["gather_scale"])

    @pnex.jit(n_threads="a.numel()")
    def copy(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = a[i]

    @pnex.jit(n_threads="a.numel()", flops="2 * 256 * a.numel()")
    def fma(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            x = a[i]
            y = float32(0.5)  # float32: a Python float literal is a float64 in Numba
            for _ in range(256):
                y = y * x + float32(0.25)
            r[i] = y

    @pnex.jit(n_threads=("c.size(1)", "c.size(0)"), flops="2 * a.size(0) * b.size(1) * a.size(1)")
    def naive_mm(a: pnex.In("f32", (None, None)), b: pnex.In("f32", (None, None)),
                 c: pnex.Out("f32", ("a.size(0)", "b.size(1)"))):
        j, i = cuda.grid(2)
        if i < c.shape[0] and j < c.shape[1]:
            s = 0.0
            for k in range(a.shape[1]):
                s += a[i, k] * b[k, j]
            c[i, j] = s

    return gather, copy, fma, naive_mm


def main() -> int:
    parser = argparse.ArgumentParser(prog="profile_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=float, default=float(1 << 24), help="elements per kernel (default 2**24)")
    parser.add_argument("--mm", type=int, default=2048, help="size of the naive matmul (default 2048)")
    options = parser.parse_args()

    import torch

    from bench_common import RESULTS, launcher_ready, result_header, write_result

    import pnex_magic as pnex
    from pnex_magic import hardware

    if not torch.cuda.is_available():
        print("profile_check: no GPU here", file=sys.stderr)
        return 2
    print(f"launcher: {launcher_ready()}")
    n = int(options.n)
    gather, copy, fma, naive_mm = kernels()
    x = torch.rand(n, device="cuda")
    idx = torch.randint(0, n, (n,), device="cuda")
    gpu = torch.cuda.get_device_name().replace(" ", "-")
    stamp = time.strftime("%Y-%m-%d-%H%M")
    folders = [RESULTS / f"ncu-{stamp}"]
    if os.environ.get("OUT"):
        folders.append(Path(os.environ["OUT"]) / "ncu")
    rows = []
    for name, op, args in (("gather", gather, (x, idx, 2.0)), ("copy", copy, (x,)), ("fma", fma, (x,))):
        op(*args)
        torch.cuda.synchronize()
        start = time.perf_counter()
        p = pnex.profile(op, *args)
        took = time.perf_counter() - start
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}-{gpu}-raw.csv").write_text(p.raw_csv)
            (folder / f"{name}-{gpu}-source.csv").write_text(p.source_csv)
        print(f"\n== {name}: profiled in {took:.1f} s\n{p}")
        f = p.figures
        rows.append({
            "kernel": name, "profile_seconds": took, "ncu": p.version, "duration_us": (f.duration or 0) * 1e6,
            "memory_sol": f.memory_sol, "compute_sol": f.compute_sol, "dram_sol": f.dram_sol,
            "achieved_occupancy": f.achieved_occupancy, "theoretical_occupancy": f.theoretical_occupancy,
            "stalls": [[s.name, s.share] for s in f.stalls[:5]],
            "hot_lines": [[h.line, h.share, h.reason, h.text] for h in p.hot_lines],
            "reason": str(p.reason()), "report": p.report_path,
        })

    info = hardware.device_info(torch.device("cuda"))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.matmul(a, a)
    end.record()
    end.synchronize()
    rate = 2 * 8192**3 / (start.elapsed_time(end) / 1e3 / 10)
    peak = hardware.peak_flops(info.arch, "fp16-tc", info.sm_count, info.sm_clock_hz, info.name)
    m = options.mm
    report = pnex.build_report(naive_mm, args=(torch.rand(m, m, device="cuda"), torch.rand(m, m, device="cuda")),
                               eager=torch.matmul, sass=False)
    c = report.compute
    roofline = {
        "sm_clock_mhz": (info.sm_clock_hz or 0) / 1e6, "bf16_matmul_tflops": rate / 1e12,
        "fp16_tc_peak_tflops": (peak.flops or 0) / 1e12, "matmul_share_of_peak": rate / peak.flops if peak.flops else None,
        "naive_mm_tflops": (c.rate or 0) / 1e12 if c else None, "naive_mm_share": c.share if c else None,
        "naive_mm_peak": c.peak.source if c and c.peak else None, "naive_mm_bound": c.bound if c else None,
        "naive_mm_why": str(report.efficiency.explanation) if report.efficiency else None,
    }
    print("\n" + "\n".join(c.lines()) if c else "\nno compute figures")
    result = {**result_header("profile-check"), "n": n, "profiles": rows, "roofline": roofline}
    path = write_result(result, "profile-check")
    print(f"\n{'kernel':<8} {'profile s':>9} {'kernel us':>9} {'memory':>7} {'compute':>7} {'occup.':>7}  top stall")
    for r in rows:
        top = r["stalls"][0] if r["stalls"] else ["-", 0]
        print(f"{r['kernel']:<8} {r['profile_seconds']:9.1f} {r['duration_us']:9.1f} {r['memory_sol']:7.0%} "
              f"{r['compute_sol']:7.0%} {r['achieved_occupancy']:7.0%}  {top[0]} {top[1]:.0%}")
    print(f"torch.matmul bf16 8192^3: {rate / 1e12:.0f} TFLOP/s = {roofline['matmul_share_of_peak'] or 0:.0%} of "
          f"pnex's FP16/BF16 tensor-core peak ({peak.source})")
    print(f"results: {path}; ncu CSVs: {', '.join(str(f) for f in folders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
