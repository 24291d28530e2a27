"""The first run's tests repeated with every core busy: the stress run of issue 34.

Each repetition runs the chosen tests of ``tests/test_first_run.py`` in a pytest
process of its own (a fresh stand-in folder, fresh caches), while ``--spinners``
processes spin (``while True: pass``, default: one per core plus one), as on a CI machine
running other jobs.  The default tests are the two that failed there: two processes starting
one build and switching to it, and a failed build seen as failed by a second process.

    python benchmarks/first_run_stress.py [--repeat 20] [--spinners 3] [--test NODEID ...]
    git worktree add /tmp/main-before main   # the "before": another revision's tests and code
    python benchmarks/first_run_stress.py --repeat 10 --source /tmp/main-before --out before.json

Prints a table (each test's passes and time) and writes
``benchmarks/results/first-run-stress-<date>.json`` (the machine, versions, the date,
every repetition's outcome and time, and the first lines of each failure).  No GPU is
needed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_first_run.py::test_two_processes_start_one_build_and_their_ops_switch_to_it",
    "tests/test_first_run.py::test_where_the_launcher_cannot_be_built_one_note_says_why[failed build]",
]


def _versions() -> dict[str, str]:
    import numba_cuda
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "numba_cuda": getattr(numba_cuda, "__version__", "?"), "compiler": _compiler()}


def _compiler() -> str:
    try:
        return subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return "none"


def _one(source: Path, code: Path, tests: list[str], report: Path) -> tuple[dict[str, dict], float]:
    """One pytest process over ``tests`` (``source``'s, importing ``code``'s pnex_magic);
    each test's outcome and time."""
    env = dict(os.environ, PYTHONPATH=str(code))
    env.pop("PNEX_CACHE_DIR", None)  # the session's own (tests/conftest.py)
    start = time.perf_counter()
    # Run from the report's folder, not the checkout: ``python -m`` and ``python -c`` put their
    # working folder first on sys.path, which would import the checkout's pnex_magic over ``code``'s.
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    "--rootdir", str(source), *(str(source / test) for test in tests)],
                   cwd=report.parent, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped") is not None
        found[name] = {"outcome": "failed" if failure is not None else "skipped" if skipped else "passed",
                       "seconds": float(case.get("time", 0)),
                       "why": "" if failure is None else (failure.get("message") or "")[:800]}
    return found, wall


def _imported(code: Path) -> str:
    """Where the tests' processes import pnex_magic from, with ``code`` on PYTHONPATH."""
    done = subprocess.run([sys.executable, "-c", "import pnex_magic; print(pnex_magic.__file__)"],
                          cwd=tempfile.gettempdir(), env=dict(os.environ, PYTHONPATH=str(code)),
                          capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="repetitions (default 20)")
    parser.add_argument("--spinners", type=int, default=(os.cpu_count() or 1) + 1,
                        help="spinning processes for the run's duration (default: one per core plus one)")
    parser.add_argument("--test", action="append", help="a test node id (default: the two of issue 34)")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose tests and pnex_magic run")
    parser.add_argument("--code", type=Path,
                        help="the checkout whose pnex_magic the tests import (default: --source): "
                             "this revision's tests on another's code")
    parser.add_argument("--out", type=Path,
                        help="the JSON file (default: benchmarks/results/first-run-stress-<date>.json)")
    args = parser.parse_args(argv)
    tests = args.test or TESTS
    code = (args.code or args.source).resolve()
    imported = _imported(code)
    print(f"pnex_magic from {imported}; tests from {args.source.resolve()}", flush=True)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spinners)]
    rows: list[dict] = []
    loads = []  # the 1-minute load average after each repetition (other users' work included)
    begin = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="pnex-stress-") as tmp:
            for r in range(args.repeat):
                found, wall = _one(args.source.resolve(), code, tests, Path(tmp) / f"report-{r}.xml")
                loads.append(round(os.getloadavg()[0], 1))
                rows.append({"repetition": r, "wall_s": round(wall, 1), "load": loads[-1], "tests": found})
                summary = ", ".join(f"{v['outcome']} {v['seconds']:.0f} s" for v in found.values())
                print(f"repetition {r + 1}/{args.repeat}: {summary}", flush=True)
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    total = time.perf_counter() - begin
    names = sorted({name for row in rows for name in row["tests"]})
    print(f"\n{'test':<80} {'passed':>8} {'failed':>7} {'median s':>9} {'max s':>7}")
    table = {}
    for name in names:
        runs = [row["tests"][name] for row in rows if name in row["tests"]]
        seconds = sorted(run["seconds"] for run in runs)
        table[name] = {"passed": sum(run["outcome"] == "passed" for run in runs),
                       "failed": sum(run["outcome"] == "failed" for run in runs),
                       "median_s": seconds[len(seconds) // 2], "max_s": seconds[-1]}
        t = table[name]
        print(f"{name[:80]:<80} {t['passed']:>8} {t['failed']:>7} {t['median_s']:>9.1f} {t['max_s']:>7.1f}")
    print(f"{args.repeat} repetitions with {args.spinners} spinning processes on {os.cpu_count()} cores "
          f"(load average {min(loads, default=0)}-{max(loads, default=0)}): {total / 60:.1f} min")
    revision, code_revision = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                       text=True).stdout.strip()
        for where in (args.source, args.code or args.source))
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": platform.node(),
              "cores": os.cpu_count(), "gpu": None, "versions": _versions(), "source": str(args.source),
              "revision": revision, "code": str(args.code or args.source), "code_revision": code_revision,
              "pnex_magic": imported, "spinners": args.spinners,
              "load": {"min": min(loads, default=None), "max": max(loads, default=None)},
              "repeat": args.repeat, "tests": tests,
              "total_s": round(total, 1), "summary": table, "repetitions": rows}
    out = args.out or ROOT / "benchmarks" / "results" / f"first-run-stress-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(t["failed"] == 0 for t in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
