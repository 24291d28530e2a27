"""What grid-wide sync and random numbers in kernels cost (issue 26, cases 4 and 5).

    python benchmarks/grid_random.py                  # on a GPU: every table
    python benchmarks/grid_random.py --device cpu     # anywhere: what a Seed adds per call (simulator)

* **seed**: what a ``Seed`` parameter adds per call: the same kernel (1,024 uniforms, one
  per thread; 32 in the simulator) with a ``Seed`` (each call draws 64 bits from torch's generator: one
  ``random_()``) against a seed passed as an integer argument; host microseconds per call
  of the op object (median of interleaved rounds), device time of queued calls, and device
  time per replay of a CUDA graph of 100 calls (where the draw is one more node).
* **philox**: 2**26 float32 uniforms and normals, one ``pnex.random`` draw per thread and
  four (``uniform4``/``normal4``), against ``torch.rand`` and ``torch.randn``: device time.
* **grid sync**: the Laplace port (1,001 points, 10,000 steps, one grid sync per step) in
  one cooperative launch against the same steps as torch operations, and per call a
  cooperative launch of a kernel that only calls ``cuda.cg.this_grid()`` against a plain
  one (host microseconds and device time).
* **xoroshiro128p**: the Monte Carlo port's kernel on 10**6 samples against
  ``1 / (torch.rand(n) + 1)``.

Each result is checked first (Laplace against float64 NumPy, the uniforms' mean).  The
script prints a table last and writes ``benchmarks/results/grid-random-<date>.json`` (and
a copy in $OUT); with ``--device cpu``, ``grid-random-cpu-<date>.json``.
"""

# No `from __future__ import annotations`: the kernel annotations below must be evaluated where written.

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "examples" / "numba_docs"))


def _kernels():
    global cuda  # a global of this module, as in a notebook (the simulator swaps module globals)
    import pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="out.size(0)", threads_per_block=256)
    def drawn(n: int, out: pnex.Out("f32", ("n",)), seed: pnex.Seed):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = pnex.random.uniform(seed, i)

    @pnex.jit(n_threads="out.size(0)", threads_per_block=256)
    def passed(n: int, out: pnex.Out("f32", ("n",)), seed: "i64"):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = pnex.random.uniform(seed, i)

    def named(fn, name: str):  # an op's name follows its function's: one per draw function, not one per factory
        fn.__name__ = fn.__qualname__ = name
        return fn

    def one_per_thread(draw):
        def fill1(n: int, out: pnex.Out("f32", ("n",)), seed: pnex.Seed):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = draw(seed, i)

        return pnex.jit(n_threads="out.size(0)", threads_per_block=256)(named(fill1, f"{draw.__name__}_1"))

    def four_per_thread(draw4):
        def fill4(n: int, out: pnex.Out("f32", ("n",)), seed: pnex.Seed):
            i = cuda.grid(1)
            if 4 * i + 3 < out.shape[0]:
                a, b, c, d = draw4(seed, i)
                out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3] = a, b, c, d

        return pnex.jit(n_threads="out.size(0) // 4", threads_per_block=256)(named(fill4, f"{draw4.__name__}_by4"))

    uniform1, uniform_by4 = one_per_thread(pnex.random.uniform), four_per_thread(pnex.random.uniform4)
    normal1, normal_by4 = one_per_thread(pnex.random.normal), four_per_thread(pnex.random.normal4)

    @pnex.jit(n_threads="x.size(0)", threads_per_block=256)
    def plain(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0

    @pnex.jit(n_threads="x.size(0)", threads_per_block=256)
    def cooperative(x: pnex.InMut("f32", (None,))):
        i = cuda.grid(1)
        g = cuda.cg.this_grid()  # makes the launch cooperative; no sync
        if i < x.shape[0]:
            x[i] += 1.0

    return {"drawn": drawn, "passed": passed, "uniform1": uniform1, "uniform_by4": uniform_by4, "normal1": normal1,
            "normal_by4": normal_by4, "plain": plain, "cooperative": cooperative}


def _host_us(calls: dict, rounds: int, per_round: int = 2000) -> dict:
    """Host microseconds per call of each of ``calls`` (calls queued back to back), in
    interleaved rounds: the minimum and the median of the rounds' figures."""
    import torch

    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            call()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(per_round):
                call()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) / per_round * 1e6)
    return {name: {"min": min(v), "median": statistics.median(v)} for name, v in samples.items()}


def _graph_us(call, replays: int = 20, calls_per_graph: int = 100) -> float:
    """Device microseconds per call in a CUDA graph of ``calls_per_graph`` calls."""
    import torch

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            call()
    from bench_common import graph_seconds

    return graph_seconds(graph, calls_per_graph, replays) * 1e6


def seed_table(k: dict, device: str, rounds: int) -> dict:
    import torch

    n = 1024 if device != "cpu" else 32  # the simulator runs a Python thread per CUDA thread
    seed = 12345
    rows = {"host_us": _host_us({"Seed": lambda: k["drawn"](n), "integer seed": lambda: k["passed"](n, seed)}, rounds,
                                per_round=2000 if device != "cpu" else 20)}
    if device == "cpu":
        from pnex_magic.random import draw_seed

        t0 = time.perf_counter()
        for _ in range(20000):
            draw_seed("cpu")
        rows["draw_seed_us"] = (time.perf_counter() - t0) / 20000 * 1e6
        return rows
    from bench_common import queued_seconds

    rows["queued_device_us"] = {"Seed": queued_seconds(k["drawn"], (n,)) * 1e6,
                                "integer seed": queued_seconds(k["passed"], (n, seed)) * 1e6}
    rows["graph_device_us"] = {"Seed": _graph_us(lambda: k["drawn"](n)),
                               "integer seed": _graph_us(lambda: k["passed"](n, seed))}
    return rows


def philox_table(k: dict) -> dict:
    import torch
    from bench_common import queued_seconds

    n = 1 << 26
    for name in ("uniform1", "uniform_by4"):
        mean = k[name](n).double().mean().item()
        assert abs(mean - 0.5) < 1e-3, (name, mean)
    out = {name: queued_seconds(k[name], (n,)) * 1e6 for name in ("uniform1", "uniform_by4", "normal1", "normal_by4")}
    out["torch.rand"] = queued_seconds(lambda: torch.rand(n, device="cuda"), ()) * 1e6
    out["torch.randn"] = queued_seconds(lambda: torch.randn(n, device="cuda"), ()) * 1e6
    return out


def grid_sync_table(k: dict, rounds: int) -> dict:
    import laplace
    import numpy as np
    import torch
    from bench_common import device_seconds, queued_seconds

    op = laplace.define()
    data = np.random.default_rng(0).random(1001) * 100
    b0, b1 = torch.tensor(data, device="cuda"), torch.zeros(1001, dtype=torch.float64, device="cuda")
    op(b0, b1, 10_000, 0.25)
    ref0, _ = laplace.reference(data, 10_000, 0.25)
    np.testing.assert_allclose(b0.cpu().numpy(), ref0, rtol=1e-10, atol=1e-10)
    pnex_call, torch_call = laplace.timed("cuda")
    x = torch.zeros(1 << 16, device="cuda")
    return {
        "laplace_10000_steps_ms": device_seconds(pnex_call, (), repeats=5) * 1e3,
        "torch_10000_steps_ms": device_seconds(torch_call, (), repeats=3) * 1e3,
        "launch_host_us": _host_us({"cooperative": lambda: k["cooperative"](x), "plain": lambda: k["plain"](x)},
                                   rounds),
        "launch_device_us": {"cooperative": queued_seconds(k["cooperative"], (x,)) * 1e6,
                             "plain": queued_seconds(k["plain"], (x,)) * 1e6},
    }


def xoroshiro_table() -> dict:
    import montecarlo
    from bench_common import queued_seconds

    pnex_call, torch_call = montecarlo.timed("cuda")
    return {"pnex_us": queued_seconds(pnex_call, ()) * 1e6, "torch_us": queued_seconds(torch_call, ()) * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where there is a GPU")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the per-call tables")
    args = parser.parse_args(argv)

    import json

    import torch

    from bench_common import cpu_header, launcher_ready, result_header, write_result

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        print(f"C++ launcher: {launcher_ready()}")  # else a fresh cache times the Python launcher
    # The kernels that take only scalars (and a Seed) make their outputs on torch's default
    # device, as torch.empty does: the GPU here, unless --device cpu.
    torch.set_default_device(device)
    kernels = _kernels()
    if device == "cpu":
        result = {**cpu_header("grid-random-cpu"), "seed": seed_table(kernels, "cpu", args.rounds)}
        path = write_result(result, "grid-random-cpu")
    else:
        result = result_header("grid-random")
        result["seed"] = seed_table(kernels, "cuda", args.rounds)
        result["philox"] = philox_table(kernels)
        result["grid_sync"] = grid_sync_table(kernels, args.rounds)
        result["xoroshiro128p"] = xoroshiro_table()
        path = write_result(result, "grid-random")
    print(json.dumps({k: v for k, v in result.items() if k not in ("versions",)}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
