"""Where the Python (driver-API) launcher's per-call time goes on a GPU.

A fresh environment's calls go through pnex's Python launcher until the C++ launcher is
built (``benchmarks/fresh_env.py``'s "per call before"): this times a 1-D copy's call
through the op against its parts alone, each the minimum of 5 runs of 2,000 calls
(host-bound: 4,096 elements): the op's Python implementation without torch's
dispatcher, the driver launcher's launch, the output's allocation, and ``torch.clone``.
``PNEX_LAUNCHER=driver`` is set here.  Prints a table and writes
``benchmarks/results/driver-overhead-<date>.json``.

    python benchmarks/driver_overhead.py          # on a GPU
"""

import argparse
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON result")
    args = parser.parse_args(argv)
    os.environ["PNEX_LAUNCHER"] = "driver"
    import torch

    if not torch.cuda.is_available():
        print("driver_overhead.py times the driver launcher on a GPU; nothing measured here.")
        return 1
    from numba import cuda

    import pnex_magic as pnex
    from pnex_magic import launch
    from pnex_magic import op as op_module
    from pnex_magic.calls import bind_arguments, launch_grid

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_common

    @pnex.jit(n_threads="a.numel()")
    def driver_copy(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    a = torch.randn(4096, device="cuda")
    out = torch.empty_like(a)
    definition = driver_copy.definition
    launcher = launch.launcher_for(a.device)
    grid, block = launch_grid(definition.spec, bind_arguments(definition.spec, (a,)), None)
    impl = op_module.make_impl(definition)
    parts = {
        "op call (dispatcher + implementation)": lambda: driver_copy(a),
        "implementation alone (no dispatcher)": lambda: impl(a),
        "driver launch alone": lambda: launcher.launch(definition, [a, out], grid, block, a.device),
        "torch.empty_like": lambda: torch.empty_like(a),
        "torch.clone": lambda: torch.clone(a),
    }
    torch.testing.assert_close(driver_copy(a), a)
    for fn in parts.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    rows = {}
    for label, fn in parts.items():
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            runs.append((time.perf_counter() - t) / args.calls * 1e6)
        rows[label] = {"us": min(runs), "runs_us": runs}
    print(f"driver launcher, 1-D copy of 4,096 float32 ({torch.cuda.get_device_name()}), host time per call")
    for label, row in rows.items():
        print(f"  {label:40s} {row['us']:7.1f} us")
    if not args.no_write:
        result = bench_common.result_header("driver-overhead")
        result["rows"] = rows
        print("wrote", bench_common.write_result(result, "driver-overhead"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
