"""Where the first kernel of a fresh script spends its time, phase by phase (issue 37).

    python benchmarks/first_use_phases.py                  # the GPU if there is one, else CPU tensors
    python benchmarks/first_use_phases.py --device cpu     # compile only (no GPU needed: NVVM and
                                                           # nvJitLink come as pip wheels)
    python benchmarks/first_use_phases.py --rounds 7 --warmup 0   # PNEX_WARMUP=0 in the children
    python benchmarks/first_use_phases.py --ablate scipy,gc,setup      # what each part of the set-up gains
    python benchmarks/first_use_phases.py --against /tmp/main-checkout  # before/after, interleaved
    python benchmarks/first_use_phases.py --device cpu --heap 200000 --gc-threshold 300  # a GPU host's heap, on CPU

Each round is a fresh Python process that does what ``benchmarks/first_use.py``'s
"new kernel" row does (``import torch``, on a GPU the CUDA context, ``import
pnex_magic``, ``from numba import cuda``, then a new kernel from the start of its
definition to its first result), then a second new kernel in the same process.  The
process wraps pnex's and Numba's stage functions (installed as their modules are
imported, so that no import moves) and charges the main thread's wall time to the
innermost stage running (exclusive time), so that a kernel's phases add up to its
total:

* ``pnex.jit`` (the definition path's imports), the spec, snapshot and fingerprint,
  the toolchain versions (package metadata, part of every cache key), the disk cache;
* Numba's typing set-up: the typing and target contexts and their registries
  (``refresh``: every typing template and lowering of numba-cuda, imported and
  installed), the first time;
* the kernel's own compile, by Numba's passes: bytecode to IR, typing, lowering to
  LLVM IR, other passes; then NVVM (LLVM IR to PTX, libdevice's load apart) and
  nvJitLink (PTX to cubin);
* the torch op's registration, and (GPU only) the first call: the launch through the
  C++ launcher, the module load.  Without a GPU the first call runs in the CUDA
  simulator, a different thing: that row is skipped, with its reason;
* waiting for pnex's background warm-up (where it runs), and what is left (``other``);
  Python's garbage collections (all phases together) are a row of their own.

``--heap N --gc-threshold 300`` imitates on CPU a GPU host's first kernel: N more
long-lived objects (torch's CUDA state) for every full collection to walk, and
collections as frequent as the GPU path's more objects make them; the rows "full
collections in: PHASE" say where the full (generation 2) collections came.

``--ablate scipy,gc,setup`` measures this checkout also with parts of
:mod:`pnex_magic.numbasetup` turned off (``setup``: Numba's own set-up, as before issue
37), ``--against DIR`` another checkout, in the same interleaved rounds: what each gain
came from, on a loaded machine.

The second kernel shows what every later kernel pays: the difference is the one-time
cost.  The background warm-up thread's own stages are listed apart (they overlap the
main thread).  Rows: the minimum and the median over rounds.  The whole script (from
``import pnex_magic`` to the first result) is a row too, so that work moved out of the
kernel's window into the imports shows.

Prints a table and writes JSON (GPU or CPU, versions, date) to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# first_use_phases_lib sits beside this file: importable when this runs as a script (and as each
# child), when it is imported with benchmarks/ on sys.path, and when it is run by path (runpy,
# ``python -I``).  Its modules import only the standard library: a child's clock starts first.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from first_use_phases_lib.child import child  # noqa: E402
from first_use_phases_lib.phases import HOOKS  # noqa: E402
from first_use_phases_lib.rounds import run_rounds  # noqa: E402
from first_use_phases_lib.summary import print_comparison, print_rows, summarise  # noqa: E402

__all__ = ["main", "run_rounds", "summarise", "HOOKS"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        ablate = tuple(a.split("=", 1)[1] for a in argv if a.startswith("--ablate="))
        heap = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--heap=")), 0)
        threshold0 = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--gc-threshold=")), 0)
        print("RESULT " + json.dumps(child(argv[1], float(argv[2]), "--warmup-at-import" in argv, ablate,
                                           "--prepare" in argv, heap, threshold0)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="cuda (default where there is a GPU) or cpu (compile only; the first call is skipped)")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes (default 5)")
    parser.add_argument("--warmup", choices=["0", "1"], default=None,
                        help="PNEX_WARMUP in the children (default: as in this environment)")
    parser.add_argument("--tag", default="", help="appended to the results file's name")
    parser.add_argument("--against", default="", metavar="DIR[,DIR]",
                        help="other checkouts (folders holding pnex_magic/) measured in the same rounds, "
                             "interleaved: a before/after on a loaded machine")
    parser.add_argument("--ablate", default="", metavar="PART[,PART]",
                        help="also measure this checkout with parts of pnex_magic.numbasetup turned off, each "
                             "a variant of its own: scipy (the BLAS probe imports SciPy), gc (no freeze of "
                             "older objects), setup (Numba's own set-up); join parts with + (scipy+gc)")
    parser.add_argument("--heap", type=int, default=0, metavar="N",
                        help="each child makes N more long-lived objects after import torch: a GPU host's large "
                             "heap (torch's CUDA state) imitated on CPU, for the garbage collections' cost")
    parser.add_argument("--gc-threshold", type=int, default=0, metavar="N",
                        help="each child sets the collector's first threshold to N (Python's: 700): more "
                             "collections, as a GPU host's first kernel (more objects) triggers; with --heap")
    parser.add_argument("--warmup-at-import", action="store_true",
                        help="experiment: each child starts pnex's background warm-up right after import pnex_magic")
    opts = parser.parse_args(argv)

    import torch

    sys.path.insert(0, str(HERE))
    from bench_common import cpu_header, result_header, write_result

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    checkouts = {"this checkout": ROOT}
    for folder in filter(None, (f.strip() for f in opts.against.split(","))):
        if not (Path(folder) / "pnex_magic" / "__init__.py").is_file():
            parser.error(f"--against {folder}: no pnex_magic/ there")
        checkouts[folder] = Path(folder).resolve()
    envs = {}
    for name, folder in checkouts.items():
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
        if opts.warmup is not None:
            env["PNEX_WARMUP"] = opts.warmup
        # As a user's Python does, the children keep byte-compiled modules (the first, untimed
        # child writes them): without, every process compiles pnex's sources again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        envs[name] = env
    print(f"first use by phase: {opts.rounds} fresh processes per checkout, {device}", flush=True)
    ablations = tuple(filter(None, (a.strip() for a in opts.ablate.split(","))))
    unknown = {p for a in ablations for p in a.split("+")} - {"scipy", "gc", "setup"}
    if unknown:
        parser.error(f"--ablate: unknown {sorted(unknown)}; choose from scipy, gc, setup")
    samples = run_rounds(device, opts.rounds, envs, warmup_at_import=opts.warmup_at_import, ablations=ablations,
                         heap=opts.heap, threshold0=opts.gc_threshold)
    results = {name: {"folder": str(checkouts.get(name, ROOT)), "rows": summarise(found, device), "samples": found}
               for name, found in samples.items()}
    header = result_header("first-use-phases") if device == "cuda" else cpu_header("first-use-phases")
    stem = "first-use-phases" + ("" if device == "cuda" else "-cpu") + (f"-{opts.tag}" if opts.tag else "")
    path = write_result({**header, "device": device, "rounds": opts.rounds, "pnex_warmup": opts.warmup,
                         "warmup_at_import": opts.warmup_at_import, "heap": opts.heap, "gc_threshold": opts.gc_threshold, "rows": results["this checkout"]["rows"],
                         "checkouts": results}, stem)
    print_rows(results["this checkout"]["rows"], device, opts.rounds)
    if len(results) > 1:
        print_comparison(results, device, opts.rounds)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
