"""GPU check of the %%pnex magic's timing path (CUDA events, speed-up, bandwidth).

    python benchmarks/gpu_check_magic.py

Needs an NVIDIA GPU.  It drives a real IPython shell as a notebook would, runs
%%pnex cells on CUDA tensors with --args/--eager, prints each report's text form
and checks that the timings are real (CUDA events, plausible bandwidth), that the
correctness check passes, and that the event timer agrees with a known GPU delay.
Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import torch  # noqa: E402

CHECKS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append((name, bool(ok), detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""))


def main() -> int:
    build_parser().parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible to PyTorch: nothing to check")
        return 2
    os.environ.setdefault("PNEX_CACHE_DIR", tempfile.mkdtemp(prefix="pnex-gpu-check-"))
    from IPython.core.interactiveshell import InteractiveShell

    from pnex_magic import timing

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}")
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch")

    # 1. The event timer against a known GPU delay.
    timer = timing.cuda_event_timer(torch.device("cuda"))
    cycles = 10_000_000
    m = timing.measure(lambda: torch.cuda._sleep(cycles), timer, repeat=5, loops=1, warmup=1)
    start = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    check("event timer vs wall clock", 0.5 < m.median / wall < 2.0,
          f"events {timing.format_time(m.median)}, wall {timing.format_time(wall)}")

    # 2. A memory-bound copy: speed-up near 1 against torch.clone, bandwidth in range.
    ip.run_cell("x = torch.randn(1 << 24, device='cuda')")
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (x,) --eager torch.clone -o rep", '''
def copy(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]
''')
    rep = ip.user_ns["rep"]
    t = rep.timing
    print(rep.to_text())
    check("copy: timed on the GPU", t is not None and t.op is not None and t.eager is not None, t.device if t else "")
    if t is not None and t.op is not None:
        check("copy: median > 0 and runs x loops recorded", t.op.median > 0 and t.op.repeat >= 5 and t.op.loops >= 1,
              str(t.op))
        check("copy: bandwidth plausible (10 GB/s .. 20 TB/s)", 1e10 < (t.bandwidth or 0) < 2e13,
              f"{(t.bandwidth or 0) / 1e9:.1f} GB/s for {timing.format_bytes(t.bytes_moved)}")
        check("copy: speed-up vs torch.clone within 0.1x .. 10x", 0.1 < (t.speedup or 0) < 10, f"{t.speedup:.2f}x")
        check("copy: correct", t.correctness is not None and t.correctness.ok, str(t.correctness))
    check("copy: grid for the arguments", rep.kernel.grid == ((1 << 24) // 256, 1, 1), str(rep.kernel.grid))
    html = rep.to_html()
    check("copy: HTML shows the timings", ("GB/s" in html or "TB/s" in html) and "speed-up" in html and "median" in html)
    view = rep.widget()
    timing_tab = view.children[1].children[-1].value  # the last tab: Timing
    check("copy: Timing tab shows median, IQR and runs x loops", "median" in timing_tab and "IQR" in timing_tab
          and "runs × loops" in timing_tab)

    # 3. mymuladd, 2-D, with a scalar.
    ip.run_cell("a = torch.randn(4096, 4096, device='cuda'); b = torch.randn(4096, 4096, device='cuda')")
    ip.run_cell_magic(
        "pnex",
        "--n-threads result.size(1),result.size(0) --args (a, b, 0.5) --eager lambda a, b, c: a * b + c -o rep2",
        '''
def mymuladd(a: In("f32", (None, None)), b: In("f32", "a"), c: float, result: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c
''')
    t2 = ip.user_ns["rep2"].timing
    print(t2)
    check("mymuladd: timed and correct", t2.op is not None and t2.correctness.ok, str(t2.correctness))

    # 4. An InMut kernel without outputs: timed, checked through the mutated argument.
    ip.run_cell("v = torch.randn(1 << 22, device='cuda')")
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (v, 2.0) --eager lambda a, s: a.add_(s) -o rep3", '''
def add_inplace(a: InMut("f32", (None,)), s: Scalar("f32")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] += s
''')
    t3 = ip.user_ns["rep3"].timing
    print(t3)
    check("add_inplace: timed and correct through the mutated argument",
          t3.op is not None and t3.correctness.ok and t3.correctness.compared == ("a (mutated)",), str(t3.correctness))

    # 5. --arch other than the GPU's: the report is for that arch, launches use the GPU's.
    ip.run_cell_magic("pnex", "--n-threads a.numel() --arch sm_80 --args (x,) --eager torch.clone -o rep4", '''
def copy(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]
''')
    rep4 = ip.user_ns["rep4"]
    check("--arch sm_80: report for sm_80, op runs on the GPU", rep4.arch == "sm_80" and rep4.timing.correctness.ok)

    # 6. What the doctor says here.
    print(ip.run_line_magic("pnex_doctor", ""))
    print(ip.run_line_magic("pnex_cache", ""))

    failed = [name for name, ok, _ in CHECKS if not ok]
    print(f"\n{len(CHECKS) - len(failed)}/{len(CHECKS)} checks passed" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
