"""Why 06_jax's saved table showed its two-steps loop at 93.9 µs a step, 5x the 17.1 µs of
``benchmarks/jax_overhead.py`` (issue 36): a jitted function traced while pnex's XLA FFI
handler is still being built launches the kernel through a Python callback
(``jax.experimental.buffer_callback`` and pnex's Python driver launcher), and JAX keeps
that trace, so every later call of the function launches that way too.

    python benchmarks/jax_trace_route.py          # on a GPU machine with JAX's CUDA plugin
    python benchmarks/jax_trace_route.py --help   # this, without a GPU

In a child process with a fresh pnex cache (so the handler is not built; its build starts
in the background at the first trace, as in a fresh notebook), the notebook's loop, two
diffusion steps per ``fori_loop`` iteration with ``unroll=8``, 2000 x 2000, is traced and
timed at once; then, once the handler is built and loaded, ``jax.clear_caches()`` and the
same function is traced and timed again.  For each: how the compiled program launches the
kernel (read from its HLO: pnex's FFI target, or a callback) and the µs per step (median
of 5 runs after a warm-up run).  Expect the first at the Python launcher's cost per call
and the second at the kernel's time; both results are checked against float64.  Prints a
table and writes JSON (GPU, driver, versions, date) to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = textwrap.dedent(
    """
    import json, os, statistics, sys, time
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.path.insert(0, {here!r})
    import jax, jax.numpy as jnp, numpy as np
    import pnex_magic as pnex
    import workloads as wl
    from pnex_magic.launch import xla

    steps, n, coeff = {steps}, {size}, 0.25
    field = wl.initial_field(n)
    u0 = jnp.asarray(field.numpy())
    reference = wl.reference_diffusion(field.cuda(), steps, coeff).cpu().numpy()
    step = pnex.jax_op(wl.diffusion_step)

    def pair(u0):  # 06_jax's loop
        def body(i, carry):
            u, scratch = carry
            scratch = step(u, scratch, coeff)
            return step(scratch, u, coeff), scratch
        u, scratch = jax.lax.fori_loop(0, steps // 2, body, (u0, jnp.zeros_like(u0)), unroll=8)
        return u

    def measure(label):
        fn = jax.jit(pair)
        text = fn.lower(u0).compile().as_text()
        route = ("pnex's FFI handler" if 'custom_call_target="' + xla.TARGET + '"' in text
                 else "a Python callback" if "custom_call_target" in text else "none")
        got = np.asarray(fn(u0))
        error = float(np.abs(got - reference).max() / np.abs(reference).max())
        assert error < 1e-3, (label, error)
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            fn(u0).block_until_ready()
            runs.append(time.perf_counter() - start)
        return dict(when=label, route=route, us_per_step=statistics.median(runs) / steps * 1e6,
                    samples_s=runs, relative_error=error, handler_loaded=xla.library_available())

    rows = [measure("traced at once, in a fresh cache (the handler building in the background)")]
    xla.load_library()  # waits for the build (or builds), then loads and registers the handler
    jax.clear_caches()
    rows.append(measure("traced again once the handler is loaded"))
    print(json.dumps(rows))
    """
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2000, help="grid points per side (default 2000)")
    parser.add_argument("--steps", type=int, default=2000, help="diffusion steps per timed run (default 2000)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    import torch

    if not torch.cuda.is_available():
        print("jax_trace_route.py needs an NVIDIA GPU (PyTorch sees none); nothing measured.")
        return 1
    from bench_common import result_header, write_result

    with tempfile.TemporaryDirectory(prefix="pnex-fresh-cache-") as cache:
        env = {**os.environ, "PNEX_CACHE_DIR": cache, "PNEX_LAUNCHER": "auto"}
        code = CHILD.format(here=str(HERE), steps=args.steps, size=args.size)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        print(done.stderr[-3000:])
        return 2
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    result = {**result_header("jax_trace_route", "jax", "jaxlib"), "args": vars(args), "rows": rows}
    path = write_result(result, "jax-trace-route")
    print(f"{args.size} x {args.size} diffusion, 06_jax's loop (two steps per iteration, unroll=8), {args.steps:,} steps")
    for r in rows:
        print(f"  {r['us_per_step']:8.2f} µs/step  through {r['route']:20s} {r['when']}")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
