"""Design probes on the GPU machine: facts that decide how a feature is built, measured
before building it (not a benchmark of the product; those are the other scripts).

    python benchmarks/probes.py [copy] [jax] [first-use] [per-call] [tools]

* ``copy``: copy kernels written with several elements per thread (one per thread,
  block-strided with the store after each load, block-strided with all loads first,
  the same with an unchecked full-block path, consecutive elements per thread)
  against ``torch.clone`` at 16 M and 256 M float32 elements: what ``pnex.Tune``'s
  example and the report's advice should teach (issue 19);
* ``jax``: the compiled HLO (copies, conditionals, custom calls in the while body)
  and per-step times of the notebook's diffusion stencil in a ``fori_loop``, with an
  ``InMut`` carry and with an ``Out`` (issue 17);
* ``first-use``: a new and an unchanged kernel, definition to first result, in fresh
  processes, with a cProfile of each (issue 20);
* ``per-call``: host cost of one call through the PnexOp, ``torch.ops.pnex.X.default``
  and a native op, for several argument counts (issue 20);
* ``muladd-ncu``: the 1 GiB ``a*b+c`` of ``jax_overhead.py`` under ``ncu``: pnex's
  kernel launched through JAX and through the PyTorch op, and XLA's fused kernel, each
  profiled after the autotuner chose (duration, DRAM throughput, grid, block,
  registers, instructions, the width of the global loads): where JAX's 3% and XLA's
  4% come from (issue 17);
* ``muladd-chain``: the same 1 GiB ``a*b+c``, ten calls: from Python (JAX and the
  PyTorch op) and as a ``fori_loop`` of ten inside one ``jax.jit`` (one dispatch):
  whether JAX's gap is per dispatch or per kernel (issue 17);
* ``inflight``: a loads-first copy's bandwidth against the bytes each SM keeps in
  flight (element size x elements per thread x resident threads), 1 GiB per call: the
  data for the report's Little's-law model (issue 30);
* ``tools``: compute-sanitizer, ncu, nvdisasm on the machine.

Prints a short table per probe; logs under ``$OUT`` when set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("OUT", "/tmp/probes"))


def _events(fn, reps=20):
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


COPY_KERNELS = '''
import pnex_magic as pnex
from numba import cuda, float32

ITEMS = {items}

@pnex.jit(n_threads="a.numel()", threads_per_block={tpb})
def naive(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def strided(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def loads_first(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array(ITEMS, float32)
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            v[k] = a[j]
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            r[j] = v[k]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def full_block(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array(ITEMS, float32)
    if cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.blockDim.x * ITEMS <= n:
        for k in range(ITEMS):
            v[k] = a[base + k * cuda.blockDim.x]
        for k in range(ITEMS):
            r[base + k * cuda.blockDim.x] = v[k]
    else:
        for k in range(ITEMS):
            j = base + k * cuda.blockDim.x
            if j < n:
                v[k] = a[j]
        for k in range(ITEMS):
            j = base + k * cuda.blockDim.x
            if j < n:
                r[j] = v[k]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def consecutive(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    for k in range(ITEMS):
        j = i * ITEMS + k
        if j < a.shape[0]:
            r[j] = a[j]
'''


def probe_copy() -> list[str]:
    import torch

    rows = []
    sizes = (16 << 20, 256 << 20)
    data = {n: torch.randn(n, device="cuda") for n in sizes}
    clone = {n: _events(lambda n=n: data[n].clone()) for n in sizes}
    rows.append("torch.clone: " + ", ".join(f"{n >> 20}M {clone[n] * 1e6:.1f} us ({8 * n / clone[n] / 1e12:.2f} TB/s)"
                                         for n in sizes))
    for tpb in (256, 512, 1024):
        for items in (1, 2, 4, 8, 16):
            ns: dict = {"__name__": f"copy_{items}_{tpb}"}
            code = COPY_KERNELS.format(items=items, tpb=tpb)
            path = OUT / f"copy_{items}_{tpb}.py"
            path.write_text(code)
            exec(compile(code, str(path), "exec"), ns)
            for name in ("naive", "strided", "loads_first", "full_block", "consecutive"):
                if name == "naive" and items != 1:
                    continue
                if name != "naive" and items == 1:
                    continue
                op = ns[name]
                fr = []
                for n in sizes:
                    out = op(data[n])
                    ok = torch.equal(out, data[n])
                    t = _events(lambda op=op, n=n: op(data[n]))
                    fr.append(f"{clone[n] / t:.2f}{'' if ok else ' WRONG'}")
                res = op.definition.compiled("sm_90").resources
                rows.append(f"{name:<12} items={items:<2} tpb={tpb:<5} regs={res.registers:<3} of clone 16M/256M: "
                            + " / ".join(fr))
    return rows


JAX_CODE = '''
import os, re, time, statistics, functools, sys
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax, jax.numpy as jnp, numpy as np, torch
sys.path.insert(0, {bench!r})
import workloads as wl
import pnex_magic as pnex
from numba import cuda, float32
N, STEPS, COEFF = 2000, 2000, 0.25
field = wl.initial_field(N)
u0 = jnp.asarray(field.numpy())
from workloads_lib import diffusion_kernels as wdk  # where diffusion_step is written
src = open(wdk.__file__).read()
start = src.index("@pnex.jit(n_threads=(\\"u.size(1)\\"")
end = src.index("def initial_field")
body = src[start:end]
ns = dict(vars(wdk))
out_src = body.replace("u_new: pnex.InMut(\\"f32\\", \\"u\\")", "u_new: pnex.Out(\\"f32\\", \\"u\\")").replace("def diffusion_step(", "def diffusion_out(")
exec(compile(out_src, "<diffusion_out>", "exec"), ns)
step_inmut = pnex.jax_op(wl.diffusion_step)
step_out = pnex.jax_op(ns["diffusion_out"])
print("out kernel spec:", ns["diffusion_out"].spec.python_signature())

@functools.partial(jax.jit, static_argnames="steps")
def d_inmut(u0, steps):
    def step(i, carry):
        u, scratch = carry
        return step_inmut(u, scratch, COEFF), u
    return jax.lax.fori_loop(0, steps, step, (u0, jnp.zeros_like(u0)))[0]

@functools.partial(jax.jit, static_argnames="steps")
def d_out(u0, steps):
    return jax.lax.fori_loop(0, steps, lambda i, u: step_out(u, COEFF), u0)

@functools.partial(jax.jit, static_argnames="steps")
def d_jnp(u0, steps):
    def step(i, u):
        p = jnp.pad(u, 1)
        return u + COEFF * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * u)
    return jax.lax.fori_loop(0, steps, step, u0)

def per_step(fn):
    fn(u0, STEPS).block_until_ready()
    runs = []
    for _ in range(5):
        t = time.perf_counter(); fn(u0, STEPS).block_until_ready(); runs.append(time.perf_counter() - t)
    return statistics.median(runs) / STEPS

for name, fn in (("inmut", d_inmut), ("out", d_out), ("jnp", d_jnp)):
    text = fn.lower(u0, STEPS).compile().as_text()
    open(os.path.join({out!r}, f"hlo_{{name}}.txt"), "w").write(text)
    counts = {{k: len(re.findall(k, text)) for k in (r"\\bcopy\\(", r"\\bcopy-start", r"conditional\\(", r"custom-call\\(", r"\\bwhile\\(", r"fusion\\(")}}
    print(f"{{name:6}} {{per_step(fn) * 1e6:8.1f}} us/step  HLO counts {{counts}}")

torch_u = field.cuda()
t0 = time.perf_counter(); wl.run_diffusion(wl.diffusion_step, torch_u, STEPS, COEFF); torch.cuda.synchronize()
t = time.perf_counter(); wl.run_diffusion(wl.diffusion_step, torch_u, STEPS, COEFF); torch.cuda.synchronize()
print(f"torch op python loop {{(time.perf_counter() - t) / STEPS * 1e6:8.1f}} us/step")

# per call, 1024 floats
x = jnp.ones(1024, jnp.float32)
@pnex.jit(n_threads="x.numel()")
def add_one(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1
f_pnex = jax.jit(pnex.jax_op(add_one))
f_jnp = jax.jit(lambda x: x + 1)
text = f_pnex.lower(x).compile().as_text()
open(os.path.join({out!r}, "hlo_add_one.txt"), "w").write(text)
for name, f in (("pnex", f_pnex), ("jnp", f_jnp)):
    f(x).block_until_ready()
    for mode in ("pipelined", "synced"):
        meds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(2000):
                y = f(x)
                if mode == "synced": y.block_until_ready()
            y.block_until_ready()
            meds.append((time.perf_counter() - t) / 2000)
        print(f"per call {{name:5}} {{mode:9}} {{min(meds) * 1e6:6.1f}} us")
print(text[:3000])
'''


def probe_jax() -> list[str]:
    code = JAX_CODE.format(bench=str(HERE), out=str(OUT))
    path = OUT / "probe_jax.py"
    path.write_text(code)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=400)
    (OUT / "probe_jax.log").write_text(r.stdout + "\n" + r.stderr)
    return (r.stdout.strip().splitlines() or []) + ([f"rc={r.returncode}: " + r.stderr.strip()[-1500:]] if r.returncode else [])


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

# Both muladd probes: jax_overhead.py's 1 GiB a*b+c kernel, tuned by an eager JAX call, as
# a jitted JAX function (k, jax_pnex), XLA's own a*b+c (jax_xla) and the PyTorch op (op).
MULADD_SETUP = '''
import os, sys, time, statistics, shutil
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, HERE_DIR)
import jax, jax.numpy as jnp, torch
import pnex_magic as pnex
import jax_overhead as jo

ns = {}
exec(jo.KERNELS, ns)
n = jo.N_LARGE
keys = jax.random.split(jax.random.key(2), 3)
a, b, c = (jax.random.normal(k, (n,), jnp.float32) for k in keys)
k = pnex.jax_op(ns["muladd"])
k(a, b, c).block_until_ready()      # the autotuner chooses, before anything is measured
jax_pnex = jax.jit(k)
jax_xla = jax.jit(lambda a, b, c: a * b + c)
ta, tb, tc = (torch.randn(n, device="cuda") for _ in range(3))
op = ns["muladd"]
'''

MULADD_NCU = '''
jax_pnex(a, b, c).block_until_ready(); jax_xla(a, b, c).block_until_ready()
op(ta, tb, tc); torch.cuda.synchronize()
cudart = torch.cuda.cudart()
cudart.cudaProfilerStart()
for _ in range(2):
    jax_pnex(a, b, c).block_until_ready()   # route 1: pnex kernel through JAX
torch.cuda.synchronize()
for _ in range(2):
    op(ta, tb, tc)                           # route 2: the same kernel, PyTorch op
torch.cuda.synchronize()
for _ in range(2):
    jax_xla(a, b, c).block_until_ready()     # route 3: XLA's fused a*b+c
cudart.cudaProfilerStop()
print("done", flush=True)
'''

def _muladd_script(name: str, body: str) -> Path:
    """A child script under $OUT: MULADD_SETUP, then ``body``."""
    path = OUT / name
    path.write_text((MULADD_SETUP + body).replace("HERE_DIR", repr(str(HERE))))
    return path


NCU_METRICS = ",".join([
    "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
    "dram__bytes_write.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "smsp__inst_executed.sum", "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__sass_inst_executed_op_global_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
])


def probe_muladd_ncu() -> list[str]:
    path = _muladd_script("probe_muladd_ncu.py", MULADD_NCU)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    # --clock-control none: the GPU's own clocks, so durations compare with wall-clock figures
    r = subprocess.run(["ncu", "--profile-from-start", "off", "--clock-control", os.environ.get("NCU_CLOCK", "none"),
                        "--metrics", NCU_METRICS, "--csv", "--print-units", "base",
                        sys.executable, str(path)], capture_output=True, text=True, timeout=400, env=env)
    (OUT / "muladd_ncu.csv").write_text(r.stdout)
    (OUT / "muladd_ncu.err").write_text(r.stderr)
    import csv
    import io

    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('"')]
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        key = (rec.get("ID", ""), rec.get("Kernel Name", "")[:60])
        rows.setdefault(key, {})[rec.get("Metric Name", "")] = rec.get("Metric Value", "")
    out = [f"ncu rc={r.returncode}; {len(rows)} kernels"]
    for (kid, name), m in rows.items():
        out.append(f"{kid:>3} {name:60s} " + " ".join(f"{k.split('__')[1][:28]}={v}" for k, v in m.items()))
    if not rows:
        out += r.stdout.strip().splitlines()[-15:] + r.stderr.strip().splitlines()[-15:]
    return out


MULADD_CHAIN = '''
print("nsys:", shutil.which("nsys"), "| ncu:", shutil.which("ncu"), flush=True)

def chain(f):
    def run(a, b, c):
        return jax.lax.fori_loop(0, 10, lambda i, acc: f(a, b, acc), c)
    return jax.jit(run)

pnex_chain, xla_chain = chain(k), chain(lambda a, b, c: a * b + c)

def med(run, reps=10):
    run()
    out = []
    for _ in range(reps):
        t = time.perf_counter(); run(); out.append(time.perf_counter() - t)
    return statistics.median(out) / 10 * 1e3

def calls(f):
    def run():
        o = None
        for _ in range(10):
            o = f(a, b, c)
        o.block_until_ready()
    return run

def torch_calls():
    for _ in range(10):
        op(ta, tb, tc)
    torch.cuda.synchronize()

def torch_chain():
    o = tc
    for _ in range(10):
        o = op(ta, tb, o)
    torch.cuda.synchronize()

rows = {
    "torch op, 10 calls": med(torch_calls),
    "torch op, 10 chained calls": med(torch_chain),
    "JAX pnex, 10 jit calls": med(calls(jax_pnex)),
    "JAX pnex, fori_loop of 10 in one jit": med(lambda: pnex_chain(a, b, c).block_until_ready()),
    "XLA a*b+c, 10 jit calls": med(calls(jax_xla)),
    "XLA a*b+c, fori_loop of 10 in one jit": med(lambda: xla_chain(a, b, c).block_until_ready()),
}
for name, ms in rows.items():
    print(f"{name:40s} {ms:.4f} ms per kernel", flush=True)
'''


def probe_muladd_chain() -> list[str]:
    path = _muladd_script("probe_muladd_chain.py", MULADD_CHAIN)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env)
    return r.stdout.strip().splitlines() + ([f"rc={r.returncode}"] + r.stderr.strip().splitlines()[-8:] if r.returncode else [])


INFLIGHT_KERNEL = '''
import pnex_magic as pnex
from numba import cuda
from numba.cuda.types import float16, float32, float64, uint8

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def copy(a: pnex.In("{dtype}", (None,)), r: pnex.Out("{dtype}", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * {items} + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array({items}, {nbtype})
    for k in range({items}):
        j = base + k * cuda.blockDim.x
        if j < n:
            v[k] = a[j]
    for k in range({items}):
        j = base + k * cuda.blockDim.x
        if j < n:
            r[j] = v[k]
'''


def probe_inflight() -> list[str]:
    """Bandwidth of a loads-first copy against the bytes each SM keeps in flight (issue 30):
    element size x elements per thread x resident threads per SM, 1 GiB read per call
    (far past L2), as a share of torch.clone's.  Where the share saturates tells the
    report's Little's-law model how many bytes in flight the GPU needs under load."""
    import json

    import torch

    from pnex_magic.hardware import device_info, resident_blocks

    info = device_info(torch.device("cuda"))
    nbytes = 1 << 30
    rows, records = [], []
    clone_t = {}
    configs = [(dt, items, 256) for dt in ("f16", "f32", "f64") for items in (1, 2, 4, 8)]
    configs += [("f32", 1, tpb) for tpb in (64, 128, 512, 1024)] + [("f32", 16, 256), ("u8", 1, 256), ("u8", 4, 256)]
    torch_dtype = {"f16": torch.float16, "f32": torch.float32, "f64": torch.float64, "u8": torch.uint8}
    data = {}
    for dt, items, tpb in configs:
        if dt not in data:
            size = torch.tensor([], dtype=torch_dtype[dt]).element_size()
            data[dt] = torch.randint(0, 100, (nbytes // size,), device="cuda").to(torch_dtype[dt])
            clone_t[dt] = _events(lambda dt=dt: data[dt].clone())
        ns: dict = {"__name__": f"inflight_{dt}_{items}_{tpb}"}
        nbtype = dict(f16="float16", f32="float32", f64="float64", u8="uint8")[dt]
        code = INFLIGHT_KERNEL.format(items=items, tpb=tpb, dtype=dt, nbtype=nbtype)
        path = OUT / f"inflight_{dt}_{items}_{tpb}.py"
        path.write_text(code)
        exec(compile(code, str(path), "exec"), ns)
        op = ns["copy"]
        x = data[dt]
        ok = torch.equal(op(x), x)
        t = _events(lambda: op(x))
        res = op.definition.compiled(info.arch).resources
        blocks = resident_blocks(info.arch, res.registers, res.shared_bytes, tpb) or 0
        size = x.element_size()
        per_sm = blocks * tpb * items * size
        rec = dict(dtype=dt, items=items, tpb=tpb, registers=res.registers, resident_blocks=blocks,
                   bytes_in_flight_per_sm=per_sm, seconds=t, clone_seconds=clone_t[dt],
                   share_of_clone=clone_t[dt] / t, bandwidth=2 * nbytes / t, correct=ok)
        records.append(rec)
        rows.append(f"{dt:<4} items={items:<2} tpb={tpb:<5} regs={res.registers:<3} blocks/SM={blocks:<3} "
                    f"in flight/SM={per_sm / 1024:7.1f} KiB  {2 * nbytes / t / 1e12:5.2f} TB/s  "
                    f"{clone_t[dt] / t:5.2f} of clone{'' if ok else '  WRONG'}")
    (OUT / "inflight.json").write_text(json.dumps(dict(
        gpu=info.name, arch=info.arch, sm_count=info.sm_count, l2_bytes=info.l2_bytes,
        peak_bandwidth=info.peak_bandwidth, torch=torch.__version__,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), records=records), indent=1))
    return [f"{info.name} ({info.arch}, {info.sm_count} SMs), clone of 1 GiB: "
            + ", ".join(f"{k} {2 * nbytes / v / 1e12:.2f} TB/s" for k, v in clone_t.items())] + rows


PROBES = {"tools": probe_tools, "copy": probe_copy, "jax": probe_jax, "first-use": probe_first_use,
          "per-call": probe_per_call, "muladd-ncu": probe_muladd_ncu,
          "muladd-chain": probe_muladd_chain, "inflight": probe_inflight}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probes", nargs="*", choices=list(PROBES), default=[], help="default: all")
    ns = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    report = []
    for name in ns.probes or list(PROBES):
        start = time.perf_counter()
        try:
            rows = PROBES[name]()
        except Exception as exc:  # a probe that fails says so and the others still run
            import traceback

            rows = [f"FAILED: {type(exc).__name__}: {exc}", *traceback.format_exc().splitlines()[-6:]]
        report.append(f"== {name} ({time.perf_counter() - start:.0f} s)")
        report += ["  " + r for r in rows]
        (OUT / "probes.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
