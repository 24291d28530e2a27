"""numba-cuda's documentation examples, ported to pnex (examples/numba_docs/, issue 26):
does each port work, how far is it from its independent reference, and its device
time against the PyTorch equivalent.

    python benchmarks/doc_examples.py                # on a machine with an NVIDIA GPU
    python benchmarks/doc_examples.py --device cpu   # CPU tensors: the simulator's column

For each port (``tests/test_numba_doc_examples.py`` describes what a port defines):
``run(device, seed)`` on fresh inputs, its results against its float64 reference (the
largest absolute difference, and whether it is within the port's tolerance); on a
GPU, ``timed("cuda")``'s pnex call and PyTorch equivalent at full size, each timed by
CUDA events around one call (median of 20 after 3 warm-up calls: the device time a
call costs, its host-side launch included where the GPU waits for it).  On CPU
tensors a CUDA C++ port must be refused (it runs on a GPU only): "refused" is its
expected outcome there.

Prints a table last and writes JSON (GPU, driver, versions, date) to
benchmarks/results/doc-examples-<date>.json (doc-examples-cpu-<date>.json for
``--device cpu``; a copy to $OUT if set).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "numba_docs"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the ports run (default cuda)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these ports only (file names without .py)")
    parser.add_argument("--seed", type=int, default=None, help="the inputs' seed (default: a fresh one)")
    parser.add_argument("--repeats", type=int, default=20, help="CUDA-event timings per call (default 20)")
    return parser


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import torch  # noqa: E402

from bench_common import cpu_header, device_seconds, launcher_ready, result_header, write_result  # noqa: E402

sys.path.insert(0, str(EXAMPLES))
from _harness import compare, load, missing_requirements, poisoned_outputs, ports  # noqa: E402


def check(module, device: str, seed: int) -> dict:
    """Run the port once; what happened."""
    row: dict = {"port": module.__name__.removeprefix("pnex_numba_docs_"), "title": module.TITLE,
                 "source": module.SOURCE, "gpu_only": module.GPU_ONLY, "tolerance": module.TOLERANCE}
    missing = missing_requirements(module)
    if missing:
        return {**row, "works": False, "outcome": f"skipped: needs {', '.join(missing)}"}
    start = time.perf_counter()
    try:
        with poisoned_outputs():
            results, references = module.run(device, seed)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a row says what went wrong
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        refused = device == "cpu" and module.GPU_ONLY and type(exc).__name__ == "KernelLaunchError" and (
            getattr(module, "FOREIGN", "?") in str(exc) and "runs on a GPU only" in str(exc))
        return {**row, "works": refused, "outcome": ("refused, as expected on CPU: " if refused else "failed: ") + text,
                "seconds": time.perf_counter() - start}
    worst, problems = compare(module, results, references)
    within = not problems
    outcome = "correct" if within else "WRONG RESULT"
    if device == "cpu" and module.GPU_ONLY:
        within, outcome = False, "ran on CPU, but a CUDA C++ port must be refused there"
    return {**row, "works": within, "outcome": outcome, "max_abs_error": worst, "problems": problems,
            "keys": sorted(references), "seconds": time.perf_counter() - start}


def timings(module, repeats: int) -> dict:
    timed = getattr(module, "timed", None)
    if timed is None:
        return {}
    pnex_call, torch_call = timed("cuda")
    pnex_s = device_seconds(pnex_call, (), repeats=repeats)
    torch_s = device_seconds(torch_call, (), repeats=repeats) if torch_call is not None else None
    return {"pnex_us": pnex_s * 1e6, "torch_us": None if torch_s is None else torch_s * 1e6,
            "ratio": None if torch_s is None else pnex_s / torch_s}


def main() -> None:
    args = build_parser().parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run with --device cpu for the simulator's column")
    if args.device == "cuda":
        print(f"C++ launcher: {launcher_ready()}")  # else a fresh cache times the Python launcher
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rows = []
    for name in [n for n in ports() if not args.only or n in args.only]:
        module = load(name)
        row = check(module, args.device, seed)
        if args.device == "cuda" and row["works"]:
            try:
                row.update(timings(module, args.repeats))
            except Exception as exc:  # noqa: BLE001
                row["timing_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rows.append(row)
        print(f"{row['port']}: {row['outcome']}", flush=True)

    def us(value):
        return "–" if value is None else f"{value:.1f}"

    print()
    print("| port | works | max abs error vs reference | pnex µs | torch µs | pnex / torch |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        error = row.get("max_abs_error")
        ratio = row.get("ratio")
        print(f"| {row['port']} | {'yes' if row['works'] else 'NO'} ({row['outcome'].split(':')[0]}) | "
              f"{'–' if error is None else f'{error:.3g}'} | {us(row.get('pnex_us'))} | {us(row.get('torch_us'))} | "
              f"{'–' if ratio is None else f'{ratio:.2f}'} |")
    works = sum(r["works"] for r in rows)
    print(f"\n{works} of {len(rows)} ports work on {args.device} (seed {seed})")
    if args.device == "cuda":
        header = result_header("doc_examples")
        stem = "doc-examples"
    else:
        header = cpu_header("doc_examples")
        stem = "doc-examples-cpu"
    path = write_result({**header, "device": args.device, "seed": seed, "ports": rows}, stem)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
