"""How fast the CUDA simulator runs kernels on CPU tensors, with and without the typed
rewrite that makes it compute with Numba-CUDA's types (issue 34).

Each workload is a pnex op called on CPU tensors (numba-cuda's simulator, one Python
thread per CUDA thread).  Two forms of the same op are timed in one process:

* ``typed``: what pnex runs, the kernel rewritten by :mod:`pnex_magic.simtyping`
  (literals, conversions, joins, ``math.*`` as Numba types them);
* ``untyped``: the kernel as the simulator ran it before (its Python source on
  NumPy scalars, NumPy's promotion rules, the simulator's array wrappers): the
  definition's typed form replaced by the snapshot's function, as before issue 34.
  In a checkout without the typed rewrite (``main`` before it) only this form runs:
  an independent "before".

Per workload: the median of ``--repeats`` calls (the two forms alternating, so that
the machine's load drifts alike for both) after the first call, the ratio typed /
untyped, and each form's first call (which makes the simulated form: for ``typed``,
the rewrite and Numba's typing of the kernel, paid once per definition).  The workloads cover what dominates a
simulated launch: thread start-up (element-wise), arithmetic in a loop (scalar
operations), integer index arithmetic (a stencil), barriers and shared memory (a
reduction) and ``math.*``.

    python benchmarks/simulator_speed.py            # all workloads
    python benchmarks/simulator_speed.py --repeats 3 --only loop

Run it with a cache folder of its own (``PNEX_CACHE_DIR``): the typed form's first
call then includes the typing, not a cache hit.

Writes ``benchmarks/results/simulator-speed-<date>.json`` (no GPU needed).
"""

# (no `from __future__ import annotations`: the kernels, defined inside _ops, evaluate their annotations there)

import argparse
import statistics
import sys
import time
from pathlib import Path

WORKLOADS = ("elementwise", "loop", "stencil", "reduction", "math")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="simulator_speed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per workload and form (median kept)")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="run only these workloads")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    return parser.parse_args()


def _ops():
    """The workloads' ops, each a fresh definition (so each form types it once)."""
    import math

    import numpy as np
    import torch
    from numba import cuda

    import pnex_magic as pnex

    @pnex.jit(n_threads="a.numel()", threads_per_block=256)
    def elementwise(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = a[i] * 2.0 + b[i]

    @pnex.jit(n_threads="a.numel()", threads_per_block=64)
    def loop(a: pnex.In("f32", (None,)), n: pnex.Scalar("i32"), r: pnex.Out("f64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            acc = 0.0
            for k in range(n):
                acc += a[i] * 0.1 + k
            r[i] = acc

    @pnex.jit(n_threads=("u.size(1)", "u.size(0)"), threads_per_block=(16, 16))
    def stencil(u: pnex.In("f32", (None, None)), out: pnex.Out("f32", "u")):
        x, y = cuda.grid(2)
        rows, cols = u.shape
        if 0 < y < rows - 1 and 0 < x < cols - 1:
            out[y, x] = u[y, x] + 0.25 * (u[y - 1, x] + u[y + 1, x] + u[y, x - 1] + u[y, x + 1] - 4 * u[y, x])

    @pnex.jit(n_threads="a.numel()", threads_per_block=128)
    def reduction(a: pnex.In("f32", (None,)), partial: pnex.Out("f32", "a")):
        tile = cuda.shared.array(128, np.float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        tile[t] = a[i] if i < a.shape[0] else 0.0
        cuda.syncthreads()
        step = 64
        while step > 0:
            if t < step:
                tile[t] += tile[t + step]
            cuda.syncthreads()
            step //= 2
        if i < a.shape[0]:
            partial[i] = tile[0]

    @pnex.jit(n_threads="a.numel()", threads_per_block=256)
    def mathy(a: pnex.In("f32", (None,)), b: pnex.In("f64", "a"), r: pnex.Out("f64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = math.exp(a[i]) * math.sin(b[i]) + math.sqrt(abs(a[i]))

    g = torch.Generator().manual_seed(0)
    return {
        "elementwise": (elementwise, (torch.rand(4096, generator=g), torch.rand(4096, generator=g))),
        "loop": (loop, (torch.rand(64, generator=g), 400)),
        "stencil": (stencil, (torch.rand(48, 48, generator=g),)),
        "reduction": (reduction, (torch.rand(1024, generator=g),)),
        "math": (mathy, (torch.rand(2048, generator=g), torch.rand(2048, generator=g, dtype=torch.float64))),
    }


def main() -> int:
    args = _parse()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_common

    from pnex_magic import definition

    # Where the typed form is made: the simulator's stage (pnex_magic.simtyping.forms), or in
    # checkouts before it the definition's own _typed_function; neither before issue 34.
    try:
        from pnex_magic.simtyping import forms as owner

        name, untyped = "typed_function", (lambda found, checked, variant: found.kernel_function(checked))
    except ImportError:
        owner, name = definition.KernelDefinition, "_typed_function"
        untyped = lambda self, checked, variant: self._kernel_function(checked)  # noqa: E731
    typed_function = getattr(owner, name, None)
    forms_wanted = ("typed", "untyped") if typed_function is not None else ("untyped",)  # main: untyped only
    chosen = args.only or list(WORKLOADS)
    forms: dict[str, dict] = {}
    first: dict[tuple[str, str], float] = {}
    for form in forms_wanted:
        # The untyped form: the kernel as the simulator ran it before issue 34 (the snapshot's
        # function, not rewritten, no cache): what KernelDefinition made of it then.
        if typed_function is not None:
            setattr(owner, name, typed_function if form == "typed" else untyped)
        forms[form] = _ops()
        for name in chosen:  # the first call: the simulated form is made (typed: rewritten, checked)
            op, op_args = forms[form][name]
            start = time.perf_counter()
            op(*op_args)
            first[(form, name)] = time.perf_counter() - start
    if typed_function is not None:
        setattr(owner, name, typed_function)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in first}
    for _ in range(args.repeats):  # the two forms alternate, so that the machine's load drifts alike for both
        for name in chosen:
            for form in forms_wanted:
                op, op_args = forms[form][name]
                start = time.perf_counter()
                op(*op_args)
                times[(form, name)].append(time.perf_counter() - start)
    table = []
    nan = float("nan")
    for name in chosen:
        ms = {form: statistics.median(times[(form, name)]) * 1e3 for form in forms_wanted}
        table.append({
            "workload": name, "typed_ms": ms.get("typed", nan), "untyped_ms": ms["untyped"],
            "ratio": ms.get("typed", nan) / ms["untyped"],
            "typed_first_call_ms": first.get(("typed", name), nan) * 1e3,
            "untyped_first_call_ms": first[("untyped", name)] * 1e3,
            "all_ms": {form: [t * 1e3 for t in times[(form, name)]] for form in forms_wanted},
        })
    print(f"{'workload':12s} {'typed ms':>10s} {'untyped ms':>11s} {'ratio':>7s} {'first call ms (typed/untyped)':>31s}")
    for row in table:
        print(f"{row['workload']:12s} {row['typed_ms']:10.1f} {row['untyped_ms']:11.1f} {row['ratio']:7.3f} "
              f"{row['typed_first_call_ms']:15.0f} / {row['untyped_first_call_ms']:<13.0f}")
    if not args.no_write:
        result = {**bench_common.cpu_header("simulator-speed"), "repeats": args.repeats, "rows": table}
        print("wrote", bench_common.write_result(result, "simulator-speed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
