"""The sections of ``benchmarks/jax_overhead.py`` that run in fresh processes: ``first_use`` (a new
and an unchanged kernel from definition to first result in JAX) and ``command_buffers`` (the
diffusion loops under XLA's command buffers)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from jax_overhead_lib.measure import log


FIRST_USE = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch, jax, jax.numpy as jnp
    import pnex_magic as pnex
    import pnex_magic.frontends.jax_op
    from numba import cuda
    from pnex_magic import cache
    torch_first = sys.argv[1] == "torch-first"
    salt = float(sys.argv[2])
    if torch_first:  # the PyTorch user's own CUDA start-up; a JAX program has none (what pnex starts is timed)
        torch.ones(1, device="cuda"); torch.cuda.synchronize()
    x = jnp.ones(1024, jnp.float32); x.block_until_ready()  # JAX's GPU client: every JAX program pays it
    # The salt is a constant of the kernel's code: a comment would not change its cache key.
    source = (
        '@pnex.jit(n_threads="x.numel()")\\n'
        'def add_salt(x: pnex.In("f32", (None,)), out: pnex.Out("f32", "x")):\\n'
        '    i = cuda.grid(1)\\n'
        '    if i < x.shape[0]:\\n'
        f'        out[i] = x[i] + {salt!r}\\n'
    )

    t0 = time.perf_counter()
    exec(compile(source, "<first-use kernel>", "exec"))
    t1 = time.perf_counter()
    times = {"define_s": t1 - t0, "define_cache_hits": cache.stats.hits, "define_cache_misses": cache.stats.misses}
    if torch_first:
        assert float(add_salt(torch.ones(1024, device="cuda"))[0]) == 1 + salt
        t1 = time.perf_counter()
        times["torch_first_call_s"] = t1 - t0 - times["define_s"]
    compiled_variants = lambda: len(getattr(add_salt.definition, "_compiled", {}))  # noqa: E731
    variants, hits, misses = compiled_variants(), cache.stats.hits, cache.stats.misses
    f = jax.jit(pnex.jax_op(add_salt))
    lowered = f.lower(x)
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    y = compiled(x)
    y.block_until_ready()
    t4 = time.perf_counter()
    assert float(y[0]) == 1 + salt and float(y[-1]) == 1 + salt
    times.update(lower_s=t2 - t1, compile_s=t3 - t2, run_s=t4 - t3, jax_first_call_s=t4 - t1, total_s=t4 - t0,
                 compiled_variants_added_by_jax=compiled_variants() - variants,
                 jax_cache_hits=cache.stats.hits - hits, jax_cache_misses=cache.stats.misses - misses,
                 torch_cuda_initialised=torch.cuda.is_initialized(),
                 cpp_extension_imported="torch.utils.cpp_extension" in sys.modules)
    print(json.dumps(times))
    """
)


def first_use(result: dict, ns: dict, args) -> None:
    import json

    def fresh(salt: float, mode: str) -> dict:
        out = subprocess.run([sys.executable, "-c", FIRST_USE, mode, repr(salt)],
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip()[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    def new_salt() -> float:  # exact in float32, as is 1 + salt: an integer below 2**20, plus a half
        return (time.time_ns() // 1000) % (1 << 20) + 0.5

    section: dict = {}
    result["first_use"] = section
    salt = new_salt()
    section["new_kernel"] = fresh(salt, "jax")
    section["unchanged_kernel"] = fresh(salt, "jax")
    section["after_pytorch_same_process"] = fresh((salt + 1) % (1 << 20), "torch-first")
    new, unchanged, after = section["new_kernel"], section["unchanged_kernel"], section["after_pytorch_same_process"]
    # What each row must be: the new kernels cache misses, the unchanged one a hit, and JAX
    # compiling and loading nothing the definition (or the PyTorch op) had not.
    section["rows_valid"] = (
        new["define_cache_misses"] >= 1 and new["define_cache_hits"] == 0
        and unchanged["define_cache_hits"] >= 1 and unchanged["define_cache_misses"] == 0
        and after["define_cache_misses"] >= 1
        and all(r["compiled_variants_added_by_jax"] == 0 and r["jax_cache_misses"] == r["jax_cache_hits"] == 0
                for r in (new, unchanged, after))
    )
    section["goal_met"] = section["rows_valid"] and new["total_s"] <= 1.0 and unchanged["total_s"] <= 0.4
    for name, row in section.items():
        if isinstance(row, dict):
            log(f"first use, {name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in row.items()))
    if not section["rows_valid"]:
        raise AssertionError("first use: a row is not what it claims (a new kernel served from the cache, or JAX "
                             "compiling or loading again): see the cache counters above")


COMMAND_BUFFERS = textwrap.dedent(
    """
    import json, os, sys, statistics, time
    sys.path.insert(0, {benchmarks!r})
    import jax, jax.numpy as jnp
    import pnex_magic as pnex
    import workloads as wl
    from jax_overhead import diffusion_loops
    steps = {steps}
    u0 = jnp.asarray(wl.initial_field({size}).numpy())
    loops = diffusion_loops(pnex.jax_op(wl.diffusion_step), jnp, jax, steps)
    out = {{}}
    for name in ("pnex in JAX, pair carry (notebook 06)", "jax.numpy stencil (XLA fuses it)"):
        fn = loops[name]
        fn(u0).block_until_ready()
        runs = []
        for _ in range({repeats}):
            start = time.perf_counter()
            fn(u0).block_until_ready()
            runs.append(time.perf_counter() - start)
        out[name] = statistics.median(runs) / steps * 1e6
    print(json.dumps(out))
    """
)


def command_buffers(result: dict, ns: dict, args) -> None:
    import json

    steps = 200 if args.quick else args.steps
    flags = "--xla_gpu_enable_command_buffer=+WHILE,+CUSTOM_CALL"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
    code = COMMAND_BUFFERS.format(benchmarks=str(Path(__file__).resolve().parents[1]), steps=steps, size=args.size,
                                  repeats=2 if args.quick else 5)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-2000:])
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    result["command_buffers"] = {"xla_flags": flags, "us_per_step": rows}
    for name, us in rows.items():
        log(f"with {flags}: {name:40s} {us:7.2f} µs/step")
