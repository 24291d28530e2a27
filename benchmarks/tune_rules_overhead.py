"""Per-call host cost of ``tune_requires`` rules that name the call's arguments.

    python benchmarks/tune_rules_overhead.py            # on a machine with an NVIDIA GPU
    python benchmarks/tune_rules_overhead.py --help     # anywhere

A rule per call (``"a.size(0) % ITEMS == 0"``) makes every call evaluate one more program
per ``Tune`` combination (which combinations the call keeps ends its autotune key) and one
more rule (that some combination holds) in the C++ launcher.  This times what that costs a
call of a copy kernel with 8 combinations (ITEMS 1, 2, 4, 8 x UNROLL 1, 2) on a 1024-float
tensor, where the host is the bottleneck: the same op with no rule, with a rule over
``Tune`` alone (which keeps every combination, so the variants are the same), with one rule
per call and with two; ``torch.clone`` beside them.  Every op is tuned first (one key).
Rows are timed in ``--rounds`` interleaved rounds (each round times every row once, in a
new order: ``--loops`` calls, then a synchronisation, wall clock); a row's figure is the
median of its rounds.  Prints the table last and writes JSON (GPU, versions, date) to
``benchmarks/results/tune-rules-overhead-<date>.json``.
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

RULES = {  # row -> tune_requires
    "no rule": None,
    "rule over Tune alone": ["ITEMS * UNROLL <= 16"],
    "one rule per call": ["a.size(0) % ITEMS == 0"],
    "two rules per call": ["a.size(0) % ITEMS == 0", "a.size(0) >= 64 * ITEMS * UNROLL"],
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of every row (default 15)")
    parser.add_argument("--loops", type=int, default=2000, help="calls a row takes in a round (default 2000)")
    return parser


def make_op(rules):
    import pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", tune_requires=rules)
    def copy8(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 2, 4, 8),
              UNROLL: pnex.Tune(1, 2)):
        base = cuda.grid(1) * ITEMS
        for k in range(ITEMS):
            if base + k < a.shape[0]:
                r[base + k] = a[base + k] * UNROLL / UNROLL

    return copy8


def host_seconds(fn, a, loops: int) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(loops):
        fn(a)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / loops


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from bench_common import launcher_ready, result_header, write_result

    if not torch.cuda.is_available():
        print("tune_rules_overhead.py needs an NVIDIA GPU (it times the C++ launcher's calls)", file=sys.stderr)
        return 2
    state = launcher_ready()
    a = torch.randn(1024, device="cuda")
    rows = {"torch.clone": torch.clone}
    for name, rules in RULES.items():
        op = make_op(rules)
        assert torch.equal(op(a), a), name  # tunes the key, checks the copy
        rows[name] = op
    from pnex_magic.launch import autotune

    chosen = {name: dict(autotune.result_for(op.definition, (a,)).tune) for name, op in rows.items()
              if name != "torch.clone"}
    times = {name: [] for name in rows}
    order = list(rows)
    rng = random.Random(0)
    for fn in rows.values():
        host_seconds(fn, a, 200)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            times[name].append(host_seconds(rows[name], a, args.loops))
    base = statistics.median(times["no rule"])
    table = [{"row": name, "us_per_call": statistics.median(t) * 1e6,
              "min_us": min(t) * 1e6, "max_us": max(t) * 1e6,
              "vs_no_rule": statistics.median(t) / base, "chosen": chosen.get(name)} for name, t in times.items()]
    result = {**result_header("tune_rules_overhead"), "launcher": state, "rounds": args.rounds, "loops": args.loops,
              "elements": a.numel(), "rows": table}
    path = write_result(result, "tune-rules-overhead")
    gpu = result.get("gpu", {}).get("name", "?")
    print(f"GPU: {gpu}  launcher: {state}  ({args.rounds} rounds x {args.loops} calls)")
    print(f"{'row':<24}{'us/call':>9}{'min':>8}{'max':>8}{'vs no rule':>12}  chosen")
    for r in table:
        print(f"{r['row']:<24}{r['us_per_call']:9.2f}{r['min_us']:8.2f}{r['max_us']:8.2f}{r['vs_no_rule']:12.3f}  "
              f"{r['chosen'] or ''}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
