"""What beginning a block's threads in turn saves the CUDA simulator (CPU tensors).

The simulator begins a block's threads one after another on one Python thread until one
waits, then starts the rest each on a Python thread of its own
(``pnex_magic.launch.block_simulator``); before, every thread started on a Python thread
of its own at once, as numba's simulator does.  This times both forms of the same ops in
one process, alternating (so that the machine's load drifts alike for both), on
:mod:`simulator_speed`'s workloads (element-wise, a loop, a stencil, a reduction with
barriers, ``math.*``) and a larger element-wise launch (16,384 threads):

* ``in_turn``: what pnex runs (``block_simulator.RUN_IN_TURN = True``);
* ``each``: every thread on a Python thread of its own from the start (``False``).

Per workload: the median of ``--repeats`` calls after a first call of each form, and the
ratio each / in_turn.

    python benchmarks/simulator_turns.py
    python benchmarks/simulator_turns.py --repeats 3 --only elementwise

Writes ``benchmarks/results/simulator-turns-<date>.json`` (no GPU needed).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("elementwise", "elementwise_16k", "loop", "stencil", "reduction", "math")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="simulator_turns.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per workload and form (median kept)")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="run only these workloads")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    return parser.parse_args()


def main() -> int:
    args = _parse()
    sys.path.insert(0, str(HERE))
    import torch

    import bench_common
    import simulator_speed
    from pnex_magic.launch import block_simulator

    ops = simulator_speed._ops()
    op = ops["elementwise"][0]
    g = torch.Generator().manual_seed(2)
    ops["elementwise_16k"] = (op, (torch.rand(16384, generator=g), torch.rand(16384, generator=g)))
    chosen = args.only or list(WORKLOADS)
    forms = {"in_turn": True, "each": False}
    results = {}
    for name in chosen:  # the first calls: typing, the rewrite, and the answers each form must give
        fn, fn_args = ops[name]
        for form, flag in forms.items():
            block_simulator.RUN_IN_TURN = flag
            results[(form, name)] = fn(*fn_args)
        written = (slice(1, -1), slice(1, -1)) if name == "stencil" else (...,)  # (the stencil leaves its edge)
        if not torch.equal(results[("in_turn", name)][written], results[("each", name)][written]):
            raise SystemExit(f"{name}: the two forms computed different results")
    times = {(form, name): [] for form in forms for name in chosen}
    try:
        for _ in range(args.repeats):
            for name in chosen:
                fn, fn_args = ops[name]
                for form, flag in forms.items():
                    block_simulator.RUN_IN_TURN = flag
                    start = time.perf_counter()
                    fn(*fn_args)
                    times[(form, name)].append(time.perf_counter() - start)
    finally:
        block_simulator.RUN_IN_TURN = True
    table = []
    for name in chosen:
        ms = {form: statistics.median(times[(form, name)]) * 1e3 for form in forms}
        table.append({"workload": name, "in_turn_ms": ms["in_turn"], "each_ms": ms["each"],
                      "speedup": ms["each"] / ms["in_turn"],
                      "all_ms": {form: [t * 1e3 for t in times[(form, name)]] for form in forms}})
    print(f"{'workload':16s} {'in turn ms':>11s} {'each ms':>9s} {'each / in turn':>15s}")
    for row in table:
        print(f"{row['workload']:16s} {row['in_turn_ms']:11.1f} {row['each_ms']:9.1f} {row['speedup']:15.2f}")
    if not args.no_write:
        result = {**bench_common.cpu_header("simulator-turns"), "repeats": args.repeats, "rows": table}
        print("wrote", bench_common.write_result(result, "simulator-turns"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
