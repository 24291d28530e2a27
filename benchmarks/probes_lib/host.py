"""The host-side probes of ``benchmarks/probes.py``: ``first-use`` (a new and an unchanged kernel,
definition to first result, with a cProfile of each), ``per-call`` (host cost of one call through
each route) and ``tools`` (compute-sanitizer, ncu, nvdisasm on the machine)."""

from __future__ import annotations

import subprocess
import sys
import time

from probes_lib.common import OUT


FIRST_USE = '''
import time, sys, cProfile, pstats, io
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import pnex_magic as pnex
t2 = time.perf_counter()
from numba import cuda
t3 = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t4 = time.perf_counter()
SALT = float(sys.argv[1])
prof = cProfile.Profile()
prof.enable()
s = time.perf_counter()
@pnex.jit(n_threads="a.numel()")
def first_use(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * SALT
d = time.perf_counter()
y = first_use(torch.ones(1000, device="cuda"))
torch.cuda.synchronize()
e = time.perf_counter()
prof.disable()
print(f"import torch {t1 - t0:.3f} s, pnex {t2 - t1:.3f} s, numba.cuda {t3 - t2:.3f} s, cuda init {t4 - t3:.3f} s; "
      f"define {d - s:.3f} s, first call {e - d:.3f} s, total {e - s:.3f} s")
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(35)
open(sys.argv[2], "w").write(buf.getvalue())
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
open(sys.argv[2], "a").write(buf.getvalue())
'''


def probe_first_use() -> list[str]:
    path = OUT / "probe_first_use.py"
    path.write_text(FIRST_USE)
    rows = []
    salt = f"{time.time() % 1000:.6f}"
    for label, s in (("warm-up (builds launcher)", "1.5"), ("new", salt), ("unchanged", salt), ("new2", salt + "1")):
        r = subprocess.run([sys.executable, str(path), s, str(OUT / f"profile_{label.split()[0]}.txt")],
                           capture_output=True, text=True, timeout=300)
        rows.append(f"{label:<26} {r.stdout.strip() or r.stderr.strip()[-800:]}")
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch; import pnex_magic"],
                       capture_output=True, text=True, timeout=120)
    (OUT / "importtime.txt").write_text(r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if "|" in ln and "cumulative" not in ln]
    pnex_lines = sorted((ln for ln in lines if "pnex" in ln or "numba" in ln),
                        key=lambda ln: -int(ln.split("|")[1]))[:8]
    rows += ["importtime (us cumulative): " + ln.strip() for ln in pnex_lines]
    return rows


PER_CALL = '''
import time, statistics, torch
import pnex_magic as pnex
from numba import cuda

@pnex.jit(n_threads="a.numel()")
def copy1(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]

@pnex.jit(n_threads=("a.size(1)", "a.size(0)"))
def five(a: pnex.In("f32", (None, None)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"), d: pnex.In("f32", "a"),
         e: pnex.InMut("f32", "a"), s: float, t: float, out: pnex.Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < a.shape[0] and x < a.shape[1]:
        out[y, x] = a[y, x] + s * b[y, x] * c[y, x] + t * d[y, x]
        e[y, x] = out[y, x]

@pnex.jit(n_threads=("a.size(2)", "a.size(1)", "a.size(0)"))
def four3(a: pnex.In("f32", (None, None, None)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
          out: pnex.Out("f32", "a")):
    x, y, z = cuda.grid(3)
    if z < a.shape[0] and y < a.shape[1] and x < a.shape[2]:
        out[z, y, x] = a[z, y, x] + b[z, y, x] * c[z, y, x]

a1 = torch.randn(1024, device="cuda")
a2 = [torch.randn(32, 32, device="cuda") for _ in range(5)]
a3 = [torch.randn(8, 8, 16, device="cuda") for _ in range(3)]
cases = {
    "copy PnexOp": lambda: copy1(a1),
    "copy ops.default": lambda: torch.ops.pnex.__getattr__(copy1.definition.op_name).default(a1),
    "torch.clone": lambda: torch.clone(a1),
    "five PnexOp": lambda: five(*a2, 0.5, 2.0),
    "five ops.default": lambda: torch.ops.pnex.__getattr__(five.definition.op_name).default(*a2, 0.5, 2.0),
    "addcmul value": lambda: torch.addcmul(a2[0], a2[1], a2[2], value=0.5),
    "four3 PnexOp": lambda: four3(*a3),
    "four3 ops.default": lambda: torch.ops.pnex.__getattr__(four3.definition.op_name).default(*a3),
    "addcmul 3d": lambda: torch.addcmul(*a3),
    "empty_like x1": lambda: torch.empty_like(a1),
}
for f in cases.values():
    f()
torch.cuda.synchronize()
res = {k: [] for k in cases}
for _ in range(7):
    for k, f in cases.items():
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(2000):
            f()
        torch.cuda.synchronize()
        res[k].append((time.perf_counter() - t) / 2000)
for k, v in res.items():
    print(f"{k:<20} {min(v) * 1e6:6.2f} us (min of 7 x 2000)  median {statistics.median(v) * 1e6:6.2f}")
'''


def probe_per_call() -> list[str]:
    path = OUT / "probe_per_call.py"
    path.write_text(PER_CALL)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    rows = r.stdout.strip().splitlines() or [r.stderr[-1500:]]
    pyspy = subprocess.run(["py-spy", "--version"], capture_output=True, text=True)
    if pyspy.returncode == 0:
        r = subprocess.run(["py-spy", "record", "--native", "-r", "2000", "-o", str(OUT / "per_call.speedscope"),
                            "-f", "raw", "--", sys.executable, str(path)], capture_output=True, text=True, timeout=300)
        rows.append(f"py-spy rc={r.returncode} {r.stderr.strip()[-300:]}")
    return rows


def probe_tools() -> list[str]:
    rows = []
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.memory", "--format=csv"],
                ["compute-sanitizer", "--version"], ["ncu", "--version"], ["which", "nvdisasm", "cuobjdump", "nvcc"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            rows.append(f"{' '.join(cmd[:1])}: " + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:]))
        except Exception as exc:
            rows.append(f"{cmd[0]}: {exc}")
    return rows
