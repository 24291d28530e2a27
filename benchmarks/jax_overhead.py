"""JAX at native speed (issue 17): pnex kernels inside ``jax.jit`` against the same
kernel from PyTorch and against jax.numpy, in one run on one GPU.

    python benchmarks/jax_overhead.py            # on a machine with an NVIDIA GPU, JAX's CUDA plugin and PyTorch
    python benchmarks/jax_overhead.py --quick    # fewer steps and repeats (a smoke run)
    python benchmarks/jax_overhead.py --help     # this, without a GPU

Sections (each goal of the issue, in the order of its Goals table):

* ``diffusion``: the 2000 x 2000 diffusion stencil of notebooks/06_jax.ipynb, 10,000
  steps, per step: pnex in JAX (``lax.fori_loop`` under ``jax.jit``, the ping-pong pair
  kept in its slots: two steps per iteration), the same kernel through the PyTorch op
  (a Python loop, workloads.run_diffusion), and jax.numpy's stencil (XLA fuses it).
  Goal: pnex in JAX at most both.  For the record, the old notebook loop (the carry
  swapping its buffers every step) and the loop with the initial field donated;
* ``stencil_hlo``: the copies XLA inserts, counted in the compiled HLO of those loops
  (in the while body, and elsewhere) and of one-step and two-step loops of a 5-point
  stencil written with ``Out(init=0.0)``; and the conditionals (none expected).
  Goal: no copy of the InMut buffer in the while body of the pair loop.  A
  ``lax.platform_dependent`` function is compiled too, to say whether XLA keeps a
  conditional on the platform (the old front end used one);
* ``muladd_1gib``: ``a*b+c`` on 1 GiB per array, 10 back-to-back calls then one sync
  (wall clock per call, median of 10), for the pnex kernel (16-byte vector loads and
  stores, ``pnex.vload``/``pnex.vstore``, ``GROUPS: pnex.Tune(1, 2)`` of them per
  thread; an eager JAX call tunes it, the trace uses that choice) through JAX, the same kernel
  through the PyTorch op (also by CUDA events) and XLA's own fused ``a*b+c``.  Goal:
  JAX at most 1.03x the PyTorch op and at most XLA's;
* ``donation``: an InMut kernel on 256 MiB called 10 times back to back, its InMut
  argument donated (``donate_argnums``) or not (XLA copies it first): the difference
  the README quotes;
* ``per_call``: jitted functions on 1024 float32, pipelined (3,000 calls, one sync)
  and synced (``block_until_ready`` after each of 2,000 calls), in 15 interleaved rounds
  (every variant once per round; a ratio is the median of the rounds' ratios):
  ``x + 1`` and ``a*b+c`` as one pnex kernel each against ``jax.jit`` of the same
  jnp expression.  Goal: pipelined at most 1.1x ``jit(x + 1)``, synced at most 1.05x;
* ``first_use``: in fresh processes, a new kernel from its definition to its first
  result in JAX (goal: 1.0 s), the unchanged kernel again (goal: 0.4 s), each split
  into define / lower / compile / run; and, in one process, JAX's first call of a
  kernel the PyTorch op already compiled (no second compile).  Outside the timer:
  the imports (torch, jax, pnex_magic, its JAX front end, ``numba.cuda``) and JAX's GPU
  client, created by the input array (``jnp.ones``), as every JAX program creates it.
  Inside: all of pnex's work, the kernel's compile or cache load, loading the C++
  launcher (defining a kernel registers its PyTorch op), loading the XLA FFI handler
  and registering it and the kernel, XLA's compile of the jitted function and the
  first run, and whatever CUDA start-up of PyTorch's pnex causes in a JAX program
  (the JAX rows create no PyTorch CUDA context before the timer; each row records
  whether PyTorch's CUDA ended up initialised).  The kernel's code holds a new
  constant per run, so "new" is a cache miss; each row records the compile cache's
  hits and misses for the definition and for JAX, and the section fails when a row is
  not what it says (a new kernel served from the cache, or JAX compiling or loading
  the kernel again: the compiled-variant count and the counters must not move);
* ``command_buffers`` (informational): the diffusion loops again in a process with
  ``XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CUSTOM_CALL`` (the handler is
  command-buffer compatible).

Every result is checked first: against a float64 reference with a tolerance that
admits one fused multiply-add rounding (XLA fuses ``a*b+c``; the kernel rounds the
product first), never exact equality or a relative tolerance alone.  Prints a table
last and writes JSON (GPU, driver, versions, date, every sample) through
``bench_common.write_result`` to ``benchmarks/results/jax-overhead-<date>.json`` (and
``$OUT``); with ``$OUT`` set, the log and the compiled HLO of every loop go there too.

The code lives in ``benchmarks/jax_overhead_lib/``, one module per part (settings, measure,
kernels, sections, processes, table); this file is the command line and the facade that exports
every name: ``import jax_overhead`` gives ``diffusion_loops``, ``hlo_counts``, ``KERNELS``,
``N_LARGE`` and the rest, as before.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # PyTorch shares the GPU

# jax_overhead_lib and bench_common sit beside this file: importable when this runs as a script,
# when it is imported with benchmarks/ on sys.path, and when it is run by path (runpy, ``python -I``).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jax_overhead_lib.settings import (  # noqa: E402  (pure Python: nothing heavy before --help)
    COEFF,
    GOALS,
    N_DONATE,
    N_LARGE,
    N_SMALL,
    SECTIONS,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="pnex kernels in JAX against the PyTorch op and jax.numpy (issue 17's Goals table).",
        epilog="Needs an NVIDIA GPU, JAX with its CUDA plugin and PyTorch with CUDA; --help needs neither.",
    )
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)}); default: all")
    parser.add_argument("--size", type=int, default=2000, help="diffusion grid points per side (default 2000)")
    parser.add_argument("--steps", type=int, default=10_000, help="diffusion steps per timed run (default 10,000)")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats: a smoke run, not for the README")
    return parser.parse_args(argv)


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    parse_args()  # prints the help and exits, before bench_common imports torch

from bench_common import gpu_info, versions, write_result  # noqa: E402
from jax_overhead_lib.kernels import KERNELS, diffusion_loops  # noqa: E402
from jax_overhead_lib.measure import (  # noqa: E402
    check_fma,
    hlo_counts,
    log,
    median_seconds,
    per_call_us,
    save_text,
)
from jax_overhead_lib.processes import COMMAND_BUFFERS, FIRST_USE, command_buffers, first_use  # noqa: E402
from jax_overhead_lib.sections import diffusion, donation, muladd_1gib, per_call, stencil_hlo  # noqa: E402
from jax_overhead_lib.table import format_table  # noqa: E402

__all__ = [
    "N_SMALL", "N_LARGE", "N_DONATE", "COEFF", "SECTIONS", "GOALS", "parse_args",
    "log", "save_text", "check_fma", "median_seconds", "per_call_us", "hlo_counts",
    "KERNELS", "diffusion_loops",
    "diffusion", "stencil_hlo", "muladd_1gib", "donation", "per_call",
    "FIRST_USE", "first_use", "COMMAND_BUFFERS", "command_buffers",
    "format_table", "main",
]


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import datetime as _dt

    import torch

    if not torch.cuda.is_available():
        print("jax_overhead.py needs an NVIDIA GPU (PyTorch sees none); nothing measured.")
        return 1
    import jax

    from pnex_magic.launch import xla

    if not any(d.platform in ("gpu", "cuda") for d in jax.devices()):
        print(f"JAX sees no GPU ({jax.devices()}); install JAX's CUDA plugin (pip install 'jax[cuda13]').")
        return 1
    result: dict = {
        "benchmark": "jax_overhead",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_info(),
        "versions": {**versions(), **{d: _version(d) for d in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin")}},
        "jax_device": str(jax.devices()[0]),
        "args": vars(args),
        "goals": GOALS,
        "errors": [],
    }
    log("JAX", jax.__version__, "on", result["jax_device"], "| GPU", result["gpu"])
    t0 = time.perf_counter()
    xla.build_library()
    result["ffi_build_s"] = time.perf_counter() - t0
    ns: dict = {}
    exec(KERNELS, ns)  # the kernels, defined the way a user's cell defines them

    sections = {"diffusion": diffusion, "stencil_hlo": stencil_hlo, "muladd_1gib": muladd_1gib, "donation": donation,
                "per_call": per_call, "first_use": first_use, "command_buffers": command_buffers}
    for name in args.only or SECTIONS:
        try:
            sections[name](result, ns, args)
        except Exception as exc:  # report it, and go on with the other sections
            result["errors"].append(f"{name}: {traceback.format_exc()}")
            log(f"{name}: FAILED {type(exc).__name__}: {exc}")

    path = write_result(result, "jax-overhead")
    print()
    table = format_table(result)
    print(table)
    log(f"\nwritten to {path}")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "jax_overhead_table.txt").write_text(table + "\n")
    return 0 if not result["errors"] else 2


if __name__ == "__main__":
    sys.exit(main())
