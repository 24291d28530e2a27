"""What beginning a block's threads in turn, and freezing older objects during a launch,
save the CUDA simulator (CPU tensors).

The simulator begins a block's threads one after another on one Python thread until one
waits, then starts the rest each on a Python thread of its own
(``pnex_magic.launch.block_simulator``); before, every thread started on a Python thread
of its own at once, as numba's simulator does.  During a launch the objects made before it
are frozen (``pnex_magic.collector``), so that the collections its thread objects trigger
do not walk torch's.  This times three forms of the same ops in one process, alternating
(so that the machine's load drifts alike for all), on :mod:`simulator_speed`'s workloads
(element-wise, a loop, a stencil, a reduction with barriers, ``math.*``) and a larger
element-wise launch (16,384 threads):

* ``in_turn``: what pnex runs (threads in turn, older objects frozen);
* ``unfrozen``: threads in turn, every collection walks every object;
* ``each``: every thread on a Python thread of its own from the start, every collection
  walks every object (what pnex did before both, and numba's simulator does).

Per workload: the median of ``--repeats`` calls after a first call of each form, and the
ratios unfrozen / in_turn and each / in_turn.

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

    import contextlib

    import bench_common
    import simulator_speed
    from pnex_magic import collector
    from pnex_magic.launch import block_simulator

    freeze = collector.older_objects_frozen

    ops = simulator_speed._ops()
    op = ops["elementwise"][0]
    g = torch.Generator().manual_seed(2)
    ops["elementwise_16k"] = (op, (torch.rand(16384, generator=g), torch.rand(16384, generator=g)))
    chosen = args.only or list(WORKLOADS)
    forms = {"in_turn": (True, True), "unfrozen": (True, False), "each": (False, False)}  # (in turn, frozen)

    def use(form: str) -> None:
        in_turn, frozen = forms[form]
        block_simulator.RUN_IN_TURN = in_turn
        collector.older_objects_frozen = freeze if frozen else (lambda: contextlib.nullcontext(False))

    results = {}
    try:
        for name in chosen:  # the first calls: typing, the rewrite, and the answers each form must give
            fn, fn_args = ops[name]
            for form in forms:
                use(form)
                results[(form, name)] = fn(*fn_args)
            written = (slice(1, -1), slice(1, -1)) if name == "stencil" else (...,)  # (the stencil leaves its edge)
            if not all(torch.equal(results[("in_turn", name)][written], results[(form, name)][written])
                       for form in forms):
                raise SystemExit(f"{name}: the forms computed different results")
        times = {(form, name): [] for form in forms for name in chosen}
        for _ in range(args.repeats):
            for name in chosen:
                fn, fn_args = ops[name]
                for form in forms:
                    use(form)
                    start = time.perf_counter()
                    fn(*fn_args)
                    times[(form, name)].append(time.perf_counter() - start)
    finally:
        block_simulator.RUN_IN_TURN = True
        collector.older_objects_frozen = freeze
    table = []
    for name in chosen:
        ms = {form: statistics.median(times[(form, name)]) * 1e3 for form in forms}
        table.append({"workload": name, "in_turn_ms": ms["in_turn"], "unfrozen_ms": ms["unfrozen"],
                      "each_ms": ms["each"], "unfrozen_speedup": ms["unfrozen"] / ms["in_turn"],
                      "speedup": ms["each"] / ms["in_turn"],
                      "all_ms": {form: [t * 1e3 for t in times[(form, name)]] for form in forms}})
    print(f"{'workload':16s} {'in turn ms':>11s} {'unfrozen ms':>12s} {'each ms':>9s} {'unfrozen / in turn':>19s} "
          f"{'each / in turn':>15s}")
    for row in table:
        print(f"{row['workload']:16s} {row['in_turn_ms']:11.1f} {row['unfrozen_ms']:12.1f} {row['each_ms']:9.1f} "
              f"{row['unfrozen_speedup']:19.2f} {row['speedup']:15.2f}")
    if not args.no_write:
        result = {**bench_common.cpu_header("simulator-turns"), "repeats": args.repeats, "rows": table}
        print("wrote", bench_common.write_result(result, "simulator-turns"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
