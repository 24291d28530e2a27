"""The JAX probes of ``benchmarks/probes.py``: ``jax`` (the diffusion stencil's compiled HLO and
per-step times in a ``fori_loop``), ``muladd-ncu`` and ``muladd-chain`` (the 1 GiB ``a*b+c`` of
``jax_overhead.py`` under ncu, and ten calls from Python against one ``jax.jit``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from probes_lib.common import HERE, OUT


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
