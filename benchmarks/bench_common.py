"""What every benchmark script writes beside its figures: the GPU, the driver, the
versions and the date; and where (benchmarks/results/, and a copy under $OUT)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS", "versions", "gpu_info", "result_header", "cpu_header", "write_result", "device_seconds",
           "queued_seconds", "interleaved_seconds", "graph_seconds", "launcher_ready"]


def launcher_ready(timeout: float = 900) -> str:
    """Wait until pnex's C++ launcher serves CUDA calls (building it where the cache has
    none) and return its state in words: a benchmark that times device work must call
    this first.  In a fresh cache the ops otherwise go through the Python launcher while
    the build runs, 80-110 us of host time a call, and back-to-back calls of a kernel
    shorter than that time the host, not the kernel (derived_backward.py on a fresh H200:
    every row 150-180 us)."""
    from pnex_magic.launch import switch

    switch.wait(timeout)
    return switch.status()


def device_seconds(fn, args, repeats: int = 20) -> float:
    """Median device time of one call ``fn(*args)``, by CUDA events around each call
    (after 3 warm-up calls): :func:`queued_seconds` with one call between the events."""
    return queued_seconds(fn, args, loops=1, repeats=repeats)


def queued_seconds(fn, args, loops: int = 20, repeats: int = 7) -> float:
    """Device time of one call ``fn(*args)`` when calls are queued back to back: the
    median over ``repeats`` of (CUDA-event time of ``loops`` calls) / ``loops``, after 3
    warm-up calls.  Unlike :func:`device_seconds` (one call between the events), a
    callable whose host side is slower than its kernels (``torch.compile``'s guards and
    launcher, several small launches) is not charged for the GPU waiting on the host
    while the GPU is busy, as in a pipeline."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / loops)
    return statistics.median(times)


def interleaved_seconds(fns: dict, args, rounds: int = 20, loops: int = 10, seed: int = 0,
                        on_timing=None) -> dict:
    """Device time of one call of each ``fns[name](*args)``, timed fairly against one
    another: every round times each once (``loops`` calls between two CUDA events) in an
    order drawn afresh, after 3 warm-up calls each; returns ``{name: [seconds per call,
    one a round]}``.  On a card held by its power limit (an H200 under matrix products)
    the clock falls as the card warms, so timing one function after another favours the
    first (2026-11-28, an H200: cuBLAS 188 us at 4096^3 in the first round, 206-225 from the
    seventh).
    ``on_timing(name, seconds, t0, t1)`` is called after each timing (host
    ``time.monotonic()`` around it: for clock samples)."""
    import random
    import time

    for fn in fns.values():
        for _ in range(3):
            fn(*args)
    rng = random.Random(seed)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.monotonic()
            start.record()
            for _ in range(loops):
                fns[name](*args)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3 / loops
            times[name].append(seconds)
            if on_timing:
                on_timing(name, seconds, t0, time.monotonic())
    return times


def graph_seconds(graph, calls_per_graph: int, repeats: int) -> float:
    """Device time of one call in a captured CUDA graph of ``calls_per_graph`` calls: the
    median over ``repeats`` of (CUDA-event time of one replay) / ``calls_per_graph``."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls_per_graph)
    return statistics.median(times)


def versions(*extra: str) -> dict:
    from importlib import metadata

    v = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for dist in ("numba-cuda", "numba", "pnex_magic", "numpy", *extra):
        try:
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            v[dist] = None
    return v


def gpu_info() -> dict:
    info = {"name": torch.cuda.get_device_name(), "capability": "%d.%d" % torch.cuda.get_device_capability()}
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip().splitlines()[0]
    except Exception:
        info["driver"] = None
    return info


def result_header(benchmark: str, *extra_versions: str) -> dict:
    """The fields every results file starts with."""
    return {
        "benchmark": benchmark,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_info(),
        "versions": versions(*extra_versions),
        **_launcher(),
    }


def cpu_header(benchmark: str, *extra_versions: str) -> dict:
    """The fields a results file of a run without a GPU starts with (``gpu`` is ``None``)."""
    return {
        "benchmark": benchmark,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": None,
        "versions": versions(*extra_versions),
    }


def _launcher() -> dict:
    """The C++ launcher's state when pnex is loaded (``{}`` otherwise)."""
    import sys

    switch = sys.modules.get("pnex_magic.launch.switch")
    return {"launcher": switch.status()} if switch is not None else {}


def write_result(result: dict, stem: str) -> Path:
    """Write ``result`` to benchmarks/results/<stem>-<date>-<time>.json (and a copy to $OUT);
    a second file of the same stem in the same minute gets ``-2`` (``-3``, ...) after the
    time (two runs of one script in a minute overwrote the first's figures, 2026-11-28)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"{stem}-{_dt.datetime.now().strftime('%Y-%m-%d-%H%M')}"
    path, n = RESULTS / f"{name}.json", 1
    while path.exists():
        n += 1
        path = RESULTS / f"{name}-{n}.json"
    path.write_text(json.dumps(result, indent=1))
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / path.name).write_text(path.read_text())
    return path
