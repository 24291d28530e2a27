"""The three workloads that motivated pnex_magic, as pnex ops, with their references and timings.

    python benchmarks/workloads.py            # full size, on a machine with an NVIDIA GPU
    python benchmarks/workloads.py --smoke    # tiny sizes, anywhere (CPU: the CUDA simulator)

* **diffusion**: the Numba documentation's 2-D diffusion stencil (shared-memory tile
  with a halo, ``cuda.syncthreads()``) on a 2000 x 2000 grid, 10,000 steps, against
  the documentation's own kernel in a raw numba-cuda launch loop and an eager
  PyTorch 5-point Laplacian (``conv2d``), plus ``torch.compile`` of it; and a
  temporal-blocking kernel (several steps per launch in shared memory, its tile shape a
  ``pnex.Tune`` choice), whose time per step may fall below the one-step memory floor.
* **LLTM**: the recurrent cell of PyTorch's C++/CUDA extension tutorial with a fused
  forward kernel and a fused backward kernel wired into autograd
  (:func:`pnex_magic.autograd.attach_backward`), forward + backward against the
  tutorial's eager Python version and ``torch.compile`` of it (default mode and,
  on a GPU, ``mode="reduce-overhead"`` for both sides), at batch 16 / 32 features /
  state 128 and at 4096 / 256 / 1024.
* **k-means**: the assignment step of the ``torch.compile`` NumPy tutorial (20 M
  2-D points: index of the nearest centroid), against eager PyTorch and
  ``torch.compile``, with int64 labels (as ``argmin``) and with int32 labels (4 bytes
  less to write per point; the references cast to int32).
* every variant of a workload runs in each of ``--rounds`` (5) interleaved rounds, so that
  drift on a shared machine hits them all; a time is the minimum of the rounds' medians
  (each round's median is in the JSON), and the LLTM's goal is judged round by round.

The notebooks (``notebooks/02_diffusion.ipynb`` ...) define the same kernels with
``%%pnex`` and time them with the functions here, so notebook and benchmark
measure the same code (``tests/test_notebooks.py`` checks the kernel sources are
identical).  Timings are CUDA-event medians over repeated runs after warm-up; the
memory floor is the time of a ``torch`` copy moving the same number of bytes,
measured in the same run.  The script prints a table and writes JSON (GPU, driver,
versions, date) to ``benchmarks/results/workloads-<date>.json``.

The code lives in ``benchmarks/workloads_lib/``, one module per part (timing, results, rounds,
provenance, then each workload's kernels and benchmark); this file is the command line and the
facade that exports every name: ``import workloads as wl`` gives ``wl.bench_kmeans``,
``wl.diffusion_step``, ``wl.markdown_table`` and the rest, as before.
"""

import argparse
import datetime as _dt
import json
import sys
import time
import types
from pathlib import Path

# workloads_lib sits beside this file: importable when this runs as a script, when it is
# imported with benchmarks/ on sys.path, and when it is run by path (runpy, ``python -I``).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from workloads_lib.rounds import DEFAULT_ROUNDS  # noqa: E402  (pure Python: nothing heavy before --help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, to check the script runs (on CPU through the simulator); writes no results")
    parser.add_argument("--only", nargs="+", choices=["diffusion", "lltm", "kmeans"],
                        default=["diffusion", "lltm", "kmeans"], help="workloads to run")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds of every variant; a time is the minimum of the rounds' medians "
                             f"(default {DEFAULT_ROUNDS}; 2 with --smoke)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the JSON (default: benchmarks/results/workloads-<date>.json; "
                             "with --smoke, nothing is written unless given)")
    return parser


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import torch  # noqa: E402

from workloads_lib import rounds as _rounds  # noqa: E402
from workloads_lib.diffusion_bench import (  # noqa: E402
    BLOCKED_PER_LAUNCH,
    DIFFUSION_FLOOR_GOAL,
    DOCS_TPB,
    RAW,
    _blocked_graph_steps,  # noqa: F401  (private, but tests read it as wl._blocked_graph_steps)
    bench_diffusion,
    blocked_tile,
    blocked_variant,
    docs_diffusion_kernel,
    judge_diffusion,
    raw_numba_diffusion,
)
from workloads_lib.diffusion_kernels import (  # noqa: E402
    HALO_SHAPE,
    MAX_STEPS_PER_LAUNCH,
    ROWS_PER_THREAD,
    TILE_ROWS,
    TX,
    TY,
    diffusion_blocked,
    diffusion_step,
    eager_step_into,
    eager_steps_into,
    initial_field,
    laplacian,
    laplacian_weight,
    reference_diffusion,
    run_diffusion,
    run_diffusion_blocked,
    run_diffusion_eager,
    torch_diffusion_step,
)
from workloads_lib.kmeans import (  # noqa: E402
    AT_FLOOR,
    POINTS_PER_THREAD,
    TUNED_KMEANS,
    _kmeans_why,  # noqa: F401  (private, read by tests)
    bench_kmeans,
    check_labels,
    kmeans_assign,
    kmeans_data,
    kmeans_ops,
    kmeans_reference,
    kmeans_tuned_ops,
)
from workloads_lib.lltm import (  # noqa: E402
    LLTM,
    LLTM_THREADS_PER_BLOCK,
    LLTMOps,
    LLTMPnex,
    _rounds_lost,  # noqa: F401  (private, read by tests)
    bench_lltm,
    lltm_backward,
    lltm_cell_backward_reference,
    lltm_cell_reference,
    lltm_forward,
    lltm_ops,
    train_lltm,
)
from workloads_lib.provenance import environment, same_kernel  # noqa: E402
from workloads_lib.results import (  # noqa: E402
    COMPILED,
    COMPILED_GRAPHS,
    EAGER,
    FLOOR,
    SPEED_COLUMNS,
    TIE,
    TIME_COLUMN,
    Row,
    Workload,
    format_table,
    goal_line,
    host_share,
    markdown_table,
    versus,
)
from workloads_lib.rounds import _each_round, _run_rounds  # noqa: E402, F401  (private, read by tests)
from workloads_lib.timing import copy_time, dram_copy_bandwidth, host_seconds, time_per_call  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = [
    # diffusion
    "TX", "TY", "ROWS_PER_THREAD", "TILE_ROWS", "HALO_SHAPE", "diffusion_step", "initial_field", "laplacian",
    "laplacian_weight", "torch_diffusion_step", "eager_step_into", "run_diffusion", "run_diffusion_eager",
    "reference_diffusion", "DOCS_TPB", "docs_diffusion_kernel", "raw_numba_diffusion", "bench_diffusion",
    "MAX_STEPS_PER_LAUNCH", "diffusion_blocked", "run_diffusion_blocked", "eager_steps_into", "blocked_tile",
    "blocked_variant", "BLOCKED_PER_LAUNCH", "RAW", "judge_diffusion", "DIFFUSION_FLOOR_GOAL",
    # LLTM
    "LLTM", "LLTMPnex", "LLTMOps", "LLTM_THREADS_PER_BLOCK", "lltm_ops", "lltm_forward", "lltm_backward",
    "lltm_cell_reference", "lltm_cell_backward_reference", "train_lltm", "bench_lltm",
    # k-means
    "POINTS_PER_THREAD", "kmeans_ops", "kmeans_tuned_ops", "kmeans_assign", "kmeans_reference", "kmeans_data",
    "check_labels", "TUNED_KMEANS", "bench_kmeans", "AT_FLOOR",
    # shared
    "Row", "Workload", "EAGER", "COMPILED", "COMPILED_GRAPHS", "FLOOR", "TIME_COLUMN", "SPEED_COLUMNS", "TIE",
    "time_per_call", "host_seconds", "copy_time", "dram_copy_bandwidth", "environment", "format_table",
    "markdown_table", "goal_line", "versus", "host_share", "same_kernel",
    # command line
    "DEFAULT_ROUNDS", "RESULTS", "FULL_SIZES", "SMOKE_SIZES", "build_parser", "run", "main",
]


def _setting(name: str) -> property:
    """A module attribute read from and written to :mod:`workloads_lib.rounds`, where
    :func:`_run_rounds` reads it."""
    return property(lambda module: getattr(_rounds, name), lambda module, value: setattr(_rounds, name, value),
                    doc=f"workloads_lib.rounds.{name}")


class _Workloads(types.ModuleType):
    """This module, with the run settings that lived here before the split as properties:
    ``wl.ROUNDS = 3`` (``--rounds``) or ``wl._TRACEBACKS = True`` changes what the benchmarks
    do, and ``monkeypatch.setattr(wl, "ROUNDS", 1)`` is undone, as before (Python's documented
    way to customise a module's attributes: its ``__class__`` set to a ModuleType subclass)."""

    ROUNDS = _setting("ROUNDS")
    _TRACEBACKS = _setting("_TRACEBACKS")


sys.modules[__name__].__class__ = _Workloads


# =============================================================================================
# Command line
# =============================================================================================

FULL_SIZES = {
    "diffusion": [dict(n=2000, steps=10_000)],
    "lltm": [dict(batch=16, features=32, state=128), dict(batch=4096, features=256, state=1024)],
    "kmeans": [dict(n_points=20_000_000), dict(n_points=20_000_000, labels_dtype=torch.int32)],
}
SMOKE_SIZES = {
    "diffusion": [dict(n=24, steps=8, repeat=2)],
    "lltm": [dict(batch=2, features=3, state=4, repeat=2, loops=1)],
    "kmeans": [dict(n_points=96, repeat=2, loops=1), dict(n_points=96, labels_dtype=torch.int32, repeat=2, loops=1)],
}


def run(only: list[str], smoke: bool, compile_variants: bool = True) -> list[Workload]:
    sizes = SMOKE_SIZES if smoke else FULL_SIZES
    benches = {"diffusion": bench_diffusion, "lltm": bench_lltm, "kmeans": bench_kmeans}
    workloads = []
    for name in only:
        for kwargs in sizes[name]:
            print(f"running {name} {kwargs} ...", flush=True)
            start = time.perf_counter()
            w = benches[name](compile_variants=compile_variants, **kwargs)
            print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
            workloads.append(w)
    return workloads


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    _rounds._TRACEBACKS = True
    _rounds.ROUNDS = opts.rounds or (2 if opts.smoke else _rounds.ROUNDS)
    env = environment()
    print(f"device: {env['device']}")
    if not opts.smoke and not torch.cuda.is_available():
        print("workloads.py measures GPU kernels and needs an NVIDIA GPU; use --smoke to check it runs here.")
        return 1
    workloads = run(opts.only, opts.smoke, compile_variants=not opts.no_compile)
    table = format_table(workloads)
    print()
    print(table)
    if opts.smoke:
        print("\n(smoke run: tiny sizes" + ("" if torch.cuda.is_available() else ", CPU simulator times mean nothing")
              + "; goals are judged at full size only)")
    result = {
        "benchmark": "workloads",
        "smoke": opts.smoke,
        "rounds": _rounds.ROUNDS,
        **env,
        "workloads": [w.to_json() for w in workloads],
        "table": table,
    }
    if torch.cuda.is_available():
        result["dram_copy_bandwidth_GBps"] = dram_copy_bandwidth("cuda") / 1e9
        print(f"\nDRAM copy bandwidth (1 GiB copy): {result['dram_copy_bandwidth_GBps']:.0f} GB/s")
    out = opts.out
    if out is None and not opts.smoke:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"workloads-{_dt.datetime.now().strftime('%Y-%m-%d-%H%M')}.json"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {out}")
    judged = [w for w in workloads if w.goal_met is not None]
    if judged:
        print(f"goals met: {sum(w.goal_met for w in judged)} of {len(judged)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
