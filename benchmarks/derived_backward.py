"""Derived backward kernels (issue 28) against hand-written ones: device time on a GPU.

For each workload the backward ops are called directly on the same inputs (incoming
gradients included) and timed with CUDA events around back-to-back calls (the derived
op's zero-filled gradients, ``Out(init=0)``, are part of its time), in interleaved
rounds (the minimum of the rounds' medians).  The goals of issue 28:

* LLTM (notebooks/03_lltm's forward): derived backward within 1.3x of the hand-written
  backward's device time;
* the 2-D 5-point stencil: derived backward within 2x of its forward;
* an elementwise kernel (``a * b + c``; the issue's kernel with a branch, math functions
  and two outputs): derived backward within 1.1x of the best hand-written one.

The row-wise weighted sum of squares is timed too, without a goal (its ``w`` gradient is
an atomic add of every row into one vector).  Before timing, the derived and hand-written
backwards are checked to agree.  ``--compile-only`` (no GPU needed) compiles every kernel
for ``--arch`` and prints registers, SASS instructions, atomics and zero-filled gradients.

Prints a table and writes ``benchmarks/results/derived-backward-<date>.json``.

    python benchmarks/derived_backward.py                 # on a GPU
    python benchmarks/derived_backward.py --compile-only  # anywhere: static figures
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="derived_backward.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every variant (default 5)")
    p.add_argument("--compile-only", action="store_true",
                   help="no timing: compile for --arch and print registers, SASS instructions and atomics")
    p.add_argument("--arch", default=None, help="target of --compile-only (default: the GPU's, else sm_90)")
    p.add_argument("--smoke", action="store_true", help="small sizes (a quick run that checks the script)")
    p.add_argument("--no-write", action="store_true", help="do not write the JSON result")
    p.add_argument("--ncu", action="store_true",
                   help="each kernel once under Nsight Compute (on a GPU, ncu on PATH): duration, instructions "
                        "issued, issue slots busy, DRAM throughput, warps active; nothing written")
    p.add_argument("--ncu-child", action="store_true", help=argparse.SUPPRESS)
    return p


NCU_METRICS = ("gpu__time_duration.sum", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
               "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
               "launch__registers_per_thread", "smsp__thread_inst_executed_per_inst_executed.ratio")


def _ncu_child(torch, rows) -> None:
    """Every variant once more (after the checks' calls), between cudaProfilerStart and Stop."""
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, _size, _goal, variants, _ratio in rows:
        for label, op, call_args in variants:
            torch.cuda.nvtx.range_push(f"{name} | {label}")
            op(*call_args)
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _ncu(argv: list[str]) -> int:
    """This script's child under ncu; prints one line per profiled kernel."""
    import csv
    import io
    import os
    import subprocess

    command = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--nvtx", "--print-units", "base",
               "--metrics", ",".join(NCU_METRICS), "--csv", sys.executable, __file__, "--ncu-child",
               *[a for a in argv if a != "--ncu"]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    out = os.environ.get("OUT")
    if out:
        Path(out, "derived_ncu.csv").write_text(done.stdout + "\n" + done.stderr)
    rows: dict = {}
    for rec in csv.DictReader(io.StringIO("\n".join(ln for ln in done.stdout.splitlines() if ln.startswith('"')))):
        key = (int(rec.get("ID", 0)), rec.get("Kernel Name", "")[:40])
        rows.setdefault(key, {})[rec.get("Metric Name", "")] = rec.get("Metric Value", "")
    if not rows:
        print(f"ncu gave no rows (rc {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        return 1
    short = {"gpu__time_duration.sum": "ns", "smsp__inst_executed.sum": "warp-instr",
             "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
             "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy%", "launch__registers_per_thread": "regs",
             "smsp__thread_inst_executed_per_inst_executed.ratio": "threads/instr"}
    print(f"{'kernel':<40} " + " ".join(f"{v:>12}" for v in short.values()))
    for (_, kernel), metrics in sorted(rows.items()):
        print(f"{kernel:<40} " + " ".join(f"{metrics.get(k, '-'):>12}" for k in short))
    return 0


def _derived_backward(op):
    """The backward op ``backward="auto"`` attached to ``op``."""
    from pnex_magic.autograd import attached_backward

    return attached_backward(op).backward


def _static(op, arch: str) -> dict:
    """Registers, SASS instructions of the kernel's own function, atomics and zero-filled outputs."""
    import re

    from pnex_magic.sass import disassemble

    compiled = op.definition.compiled(arch)
    found = disassemble(compiled.cubin, entry=compiled.entry)
    own = found.text.split("Function :")[1] if found.text and "Function :" in found.text else (found.text or "")
    instructions = [line for line in own.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    return {
        "registers": compiled.resources.registers if compiled.resources else None,
        "sass_instructions": len(instructions) if found.text else None,
        "atomics": sum(bool(re.search(r"\b(RED|ATOMG?)\.", line)) for line in instructions) if found.text else None,
        "zero_filled_outputs": [p.name for p in op.spec.outputs if p.init is not None],
    }


def _workloads(torch, dk, wl, smoke: bool):
    """(name, size, goal, (label, op, args) per variant, what the ratio compares)."""
    dev = "cuda"
    f32 = torch.float32
    derived = dk.kernels(f32, threads=256)
    hand = dk.hand_written(f32, threads=256)
    n = (1 << 16) if smoke else (1 << 24)
    a, b, g = (torch.randn(n, device=dev) for _ in range(3))
    x, w, gy, gz = (torch.randn(n, device=dev) for _ in range(4))
    rows = []
    rows.append(("a*b+c", f"{n:,} float32", 1.1,
                 [("forward", derived.muladd, (a, b, 0.5)),
                  ("hand-written backward", hand.muladd, (g, a, b)),
                  ("derived backward", _derived_backward(derived.muladd), (a, b, 0.5, g))],
                 ("derived backward", "hand-written backward")))
    rows.append(("elementwise (branch, math, 2 outputs)", f"{n:,} float32", 1.1,
                 [("forward", derived.elementwise, (x, w, 0.375)),
                  ("hand-written backward", hand.elementwise, (x, w, 0.375, gy, gz)),
                  ("derived backward", _derived_backward(derived.elementwise), (x, w, 0.375, gy, gz))],
                 ("derived backward", "hand-written backward")))
    for batch, state in ((16, 128), (64, 256)) if smoke else ((16, 128), (4096, 1024)):
        gates = torch.randn(batch, 3 * state, device=dev)
        cell = torch.randn(batch, state, device=dev)
        new_cell = wl.lltm_cell_reference(gates, cell)[1]
        gh, gc = torch.randn_like(cell), torch.randn_like(cell)
        rows.append((f"LLTM {batch}/{state}", f"gates {batch}x{3 * state} float32", 1.3,
                     [("forward", derived.lltm, (gates, cell)),
                      ("hand-written backward", hand.lltm, (gh, gc, gates, new_cell)),
                      ("derived backward", _derived_backward(derived.lltm), (gates, cell, gh, gc))],
                     ("derived backward", "hand-written backward")))
    side = 512 if smoke else 4096
    u = torch.randn(side, side, device=dev)
    rows.append(("5-point stencil", f"{side}x{side} float32", 2.0,
                 [("forward", derived.stencil, (u, 0.25)),
                  ("derived backward", _derived_backward(derived.stencil), (u, 0.25, torch.randn_like(u)))],
                 ("derived backward", "forward")))
    xr, wr = torch.randn(8192 if not smoke else 512, 256, device=dev), torch.randn(256, device=dev)
    rows.append(("row-wise weighted sum of squares", f"{xr.shape[0]}x{xr.shape[1]} float32", None,
                 [("forward", derived.rowsq, (xr, wr)),
                  ("derived backward", _derived_backward(derived.rowsq),
                   (xr, wr, torch.randn(xr.shape[0], device=dev)))],
                 ("derived backward", "forward")))
    return rows


def _check(torch, rows) -> list[str]:
    """The derived backward's results against the hand-written one's (float32)."""
    problems = []
    for name, _size, _goal, variants, _ratio in rows:
        found = {label: (op, args) for label, op, args in variants}
        if "hand-written backward" not in found:
            continue
        got = found["derived backward"][0](*found["derived backward"][1])
        want = found["hand-written backward"][0](*found["hand-written backward"][1])
        for gd, gh in zip(got, want):
            scale = gh.abs().max().item() or 1.0
            if not torch.allclose(gd, gh, rtol=1e-4, atol=1e-5 * scale):
                problems.append(f"{name}: max difference {(gd - gh).abs().max().item():.3g} (scale {scale:.3g})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import torch

    import bench_common
    import derived_kernels as dk
    import workloads as wl

    if args.compile_only or not torch.cuda.is_available():
        if not args.compile_only:
            print("no GPU here: printing the static figures (--compile-only); time on a GPU")
        arch = args.arch or "sm_90"
        f32 = torch.float32
        derived, hand = dk.kernels(f32, threads=256), dk.hand_written(f32, threads=256)
        ops = [("a*b+c forward", derived.muladd), ("a*b+c hand-written backward", hand.muladd),
               ("a*b+c derived backward", _derived_backward(derived.muladd)),
               ("elementwise forward", derived.elementwise), ("elementwise hand-written backward", hand.elementwise),
               ("elementwise derived backward", _derived_backward(derived.elementwise)),
               ("LLTM forward", derived.lltm), ("LLTM hand-written backward", hand.lltm),
               ("LLTM derived backward", _derived_backward(derived.lltm)),
               ("stencil forward", derived.stencil), ("stencil derived backward", _derived_backward(derived.stencil)),
               ("rowsq forward", derived.rowsq), ("rowsq derived backward", _derived_backward(derived.rowsq))]
        figures = {label: _static(op, arch) for label, op in ops}
        print(f"{'kernel':<36} {'registers':>9} {'SASS':>6} {'atomics':>8}  zero-filled outputs ({arch})")
        for label, f in figures.items():
            print(f"{label:<36} {f['registers']!s:>9} {f['sass_instructions']!s:>6} {f['atomics']!s:>8}  "
                  f"{', '.join(f['zero_filled_outputs']) or '-'}")
        if not args.no_write:
            result = {"benchmark": "derived_backward --compile-only", "arch": arch, "static": figures,
                      "versions": bench_common.versions()}
            print("wrote", bench_common.write_result(result, "derived-backward-compile-only"))
        return 0

    if args.ncu:
        return _ncu(sys.argv[1:] if argv is None else argv)
    launcher = bench_common.launcher_ready()  # else a fresh cache times the Python launcher
    print(f"C++ launcher: {launcher}")
    rows = _workloads(torch, dk, wl, args.smoke)
    problems = _check(torch, rows)
    if problems:
        print("the derived backward differs from the hand-written one:\n  " + "\n  ".join(problems))
        return 1
    if args.ncu_child:
        _ncu_child(torch, rows)
        return 0
    times: dict = {}
    for _ in range(args.rounds):  # interleaved: load on a shared GPU hits every variant alike
        for name, _size, _goal, variants, _ratio in rows:
            for label, op, call_args in variants:
                t = bench_common.queued_seconds(op, call_args, loops=20, repeats=7)
                times.setdefault((name, label), []).append(t)
    report = []
    print(f"{'workload':<40} {'size':<26} {'forward':>10} {'hand bwd':>10} {'derived bwd':>12} {'ratio':>7} "
          f"{'goal':>6}")
    for name, size, goal, variants, (num, den) in rows:
        best = {label: min(times[(name, label)]) for label, _op, _a in variants}
        ratio = best[num] / best[den]
        met = None if goal is None else ratio <= goal
        fmt = lambda label: f"{best[label] * 1e6:.1f} us" if label in best else "-"  # noqa: E731
        print(f"{name:<40} {size:<26} {fmt('forward'):>10} {fmt('hand-written backward'):>10} "
              f"{fmt('derived backward'):>12} {ratio:>6.2f}x "
              f"{'-' if goal is None else ('<=%.1fx %s' % (goal, 'met' if met else 'MISSED')):>6}")
        report.append({
            "workload": name, "size": size, "seconds": best, "rounds": {k[1]: v for k, v in times.items() if k[0] == name},
            "ratio": ratio, "ratio_of": [num, den], "goal": goal, "met": met,
            "static": {label: _static(op, "sm_%d%d" % torch.cuda.get_device_capability()) for label, op, _ in variants},
        })
    if not args.no_write:
        result = bench_common.result_header("derived_backward")
        result["rows"] = report
        print("wrote", bench_common.write_result(result, "derived-backward"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
