"""The CUDA simulator against the GPU on random kernels (issue 34): the same pnex op on
CPU tensors (numba-cuda's simulator, through pnex's typed rewrite) and on CUDA tensors.

Each random kernel (``tests/random_kernels.py``, GPU mode: float32/float64/int32/int64
mixes, Python literals, locals, a loop whose accumulator changes type, branches, a
conditional expression, integer floor division, modulo and shifts, float ``%``,
saturating conversions; no transcendental function) is defined twice, each into a
cache of its own:

* with NVVM's floating-point contraction off (``-fma=0``): the simulator must agree
  bit for bit (NaN equal to NaN); a kernel that does not is a mismatch, and the run
  fails;
* as pnex compiles it (contraction on: NVVM and ptxas fuse ``a * b + c`` into one
  ``fma``): how many kernels then differ, and by how many ulp at most, is reported.

Then each ``math.*`` function (float32, float64) on 4096 inputs across its domain: the
largest distance in ulp between the simulator and libdevice, against the bound the
simulator promises (libdevice's documented bound plus one ulp).

    python benchmarks/sim_vs_gpu.py --kernels 1000        # on the GPU machine

Writes ``benchmarks/results/sim-vs-gpu-<date>.json``: the GPU, versions, the number of
kernels compared and each mismatch's seed and kernel.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sim_vs_gpu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=500, help="random kernels to compare (default 500)")
    parser.add_argument("--seed", type=int, default=None, help="the first kernel's seed (default: a fresh one)")
    parser.add_argument("--no-math", action="store_true", help="skip the math.* functions' table")
    parser.add_argument("--no-write", action="store_true", help="print only")
    return parser.parse_args()


def _ops(kernel, module, folder: Path, contraction: bool):
    """The kernel's pnex op, compiled into a cache of its own (with or without contraction)."""
    import os

    import pnex_magic as pnex
    import random_kernels as rk

    cache = folder / ("cache-contract" if contraction else "cache-exact")
    cache.mkdir(exist_ok=True)
    os.environ["PNEX_CACHE_DIR"] = str(cache)
    fn = getattr(module, kernel.name)
    if contraction:
        return pnex.jit(n_threads="a.numel()", threads_per_block=rk.TPB)(fn)
    with rk.no_contraction():
        return pnex.jit(n_threads="a.numel()", threads_per_block=rk.TPB)(fn)


def _largest_ulp(cpu: dict, gpu: dict) -> int:
    import numpy as np

    import random_kernels as rk

    worst = 0
    for name in cpu:
        if cpu[name].dtype.kind == "f":
            worst = max(worst, int(rk.ulp_distance(cpu[name], gpu[name]).max()))
        elif not np.array_equal(cpu[name], gpu[name]):
            worst = max(worst, -1)  # an integer output differs (marked by the caller)
    return worst


def main() -> int:
    args = _parse()
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(here.parent / "tests"))
    import random

    import torch

    import bench_common
    import random_kernels as rk

    if not torch.cuda.is_available():
        print("no GPU: nothing to compare")
        return 1
    folder = Path(tempfile.mkdtemp(prefix="sim-vs-gpu-"))
    sys.path.insert(0, str(folder))
    base = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    import pnex_magic as pnex

    mismatches, contracted, refused, start = [], [], [], time.perf_counter()
    for k in range(args.kernels):
        seed = base + k
        kernel = rk.random_kernel(random.Random(seed), gpu=True, seed=seed)
        module = rk.load(kernel.kernel_source(), kernel.name, folder)
        values = kernel.inputs(seed)
        try:
            exact = _ops(kernel, module, folder, contraction=False)
        except pnex.KernelTypingError as exc:  # Numba refuses the kernel itself (on a GPU machine jit() compiles it)
            refused.append({"seed": seed, "error": str(exc).splitlines()[0][:300]})
            continue
        outcomes = {}
        for device in ("cpu", "cuda"):  # a kernel Numba refuses (a folded literal beyond int64) must be refused on both
            try:
                outcomes[device] = rk.run_op(kernel, exact, values, device)
            except pnex.KernelTypingError as exc:
                outcomes[device] = exc
        if all(isinstance(o, pnex.KernelTypingError) for o in outcomes.values()):
            refused.append({"seed": seed, "error": str(outcomes["cuda"]).splitlines()[0][:300]})
            continue
        if any(isinstance(o, pnex.KernelTypingError) for o in outcomes.values()):
            problems = [f"{d}: {str(o).splitlines()[0][:300]}" for d, o in outcomes.items() if isinstance(o, Exception)]
            mismatches.append({"seed": seed, "problems": problems, "kernel": kernel.kernel_source()})
            print(f"MISMATCH seed {seed}: refused on one device only: {problems}")
            continue
        cpu = outcomes["cpu"]
        problems = rk.differences(cpu, outcomes["cuda"])
        if problems:
            mismatches.append({"seed": seed, "problems": problems, "kernel": kernel.kernel_source()})
            print(f"MISMATCH seed {seed}: {problems}")
        default = _ops(kernel, module, folder, contraction=True)
        gpu_default = rk.run_op(kernel, default, values, "cuda")
        if rk.differences(cpu, gpu_default):
            contracted.append({"seed": seed, "largest_ulp": _largest_ulp(cpu, gpu_default)})
        if (k + 1) % 50 == 0:
            print(f"{k + 1} kernels, {len(mismatches)} mismatches, {time.perf_counter() - start:.0f} s")
    math_rows = [] if args.no_math else _math_table(folder)
    name = torch.cuda.get_device_name()
    print(f"\n{name}: {args.kernels} random kernels (seeds {base}..{base + args.kernels - 1})")
    compared = args.kernels - len(refused)
    print(f"  contraction off: {compared - len(mismatches)} bit for bit equal, {len(mismatches)} mismatches"
          f" ({len(refused)} refused by Numba's typing on both devices, e.g. a folded literal beyond int64)")
    print(f"  contraction on (pnex's default build): {len(contracted)} kernels differ "
          f"(largest {max((c['largest_ulp'] for c in contracted), default=0)} ulp)")
    for row in math_rows:
        flag = "" if row["ok"] else "   <-- beyond the bound"
        print(f"  math.{row['function']:10s} {row['dtype']}: {row['largest_ulp']:3d} ulp (bound {row['bound']}){flag}")
    if not args.no_write:
        result = {**bench_common.result_header("sim-vs-gpu"), "kernels_generated": args.kernels, "first_seed": base,
                  "refused_on_both": refused, "kernels_compared": compared,
                  "bit_for_bit_equal": compared - len(mismatches), "mismatches": mismatches,
                  "differ_with_contraction": len(contracted), "contraction": contracted, "math": math_rows,
                  "seconds": time.perf_counter() - start}
        print("wrote", bench_common.write_result(result, "sim-vs-gpu"))
    return 1 if mismatches or not all(r["ok"] for r in math_rows) else 0


def _math_table(folder: Path) -> list[dict]:
    import test_simulator_gpu as t
    import torch

    import pnex_magic as pnex
    import random_kernels as rk
    from pnex_magic.simtyping.runtime import EXACT_MATH, TRANSCENDENTAL

    rows = []
    for name, arity, (lo, hi) in t._FUNCTIONS:
        for dtype, tdt in (("f32", torch.float32), ("f64", torch.float64)):
            op = pnex.jit(n_threads="x.numel()", threads_per_block=128)(t._math_kernel(name, arity, dtype, folder))
            g = torch.Generator().manual_seed(7)
            x = (torch.rand(4096, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(tdt)
            y = (torch.rand(4096, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(tdt)
            worst = int(rk.math_distance(name, op(x, y).numpy(), op(x.cuda(), y.cuda()).cpu().numpy()).max())
            bound = 0 if name in EXACT_MATH else TRANSCENDENTAL[name][0 if dtype == "f32" else 1] + 1
            rows.append({"function": name, "dtype": dtype, "largest_ulp": worst, "bound": bound, "ok": worst <= bound})
    return rows


if __name__ == "__main__":
    sys.exit(main())
