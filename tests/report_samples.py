"""Reports as a GPU run shows them, made on CPU from figures recorded on GPUs, for tests of
their rendering (``tests/test_browser.py``, ``tests/test_efficiency.py``).  No
``from __future__ import annotations`` here: pnex evaluates the kernels' annotations.

Every figure is a measurement: the H200's from ``benchmarks/results/autotune-2026-11-23-2150.json``
(16 Mi float32: every candidate of the ``Tune`` copy, ``torch.clone`` 34.72 µs, the report's
copy 3.71 TB/s), the H100's from ``benchmarks/results/inflight-2026-11-25-h100.json`` (1 GiB
read: one element per thread in blocks of 128, 1.2788 ms) with the report's copy of 2.86 TB/s
(``benchmarks/results/logs-2026-11-25/eff.txt``).  The H200's reports of the notebooks (saved from
a GPU run on 2026-11-26, ``notebooks/*.ipynb``) give the rest: the quickstart's ``gated`` kernel
(91 µs against eager's 134 µs, copy 4.07 TB/s, peak 4.81 TB/s), 05_colab's 2-D ``muladd`` on
4096 × 4096 float32 (71.8 µs against 84.3 µs, copy 3.91 TB/s) and 03_lltm's forward kernel at the
tutorial's size (7.91 µs against 58.4 µs for 48 KiB).
"""

import dataclasses
import inspect
import math

from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic.efficiency import LaunchFacts, assess
from pnex_magic.launch import autotune
from pnex_magic.profiles import profile
from pnex_magic.render.report import PnexReport
from pnex_magic.timing import Correctness, Measurement, TimingResult
from pnex_magic.tune_template import tune_template

__all__ = ["tuned_copy_report", "naive_copy_report", "small_blocks_report", "gated_report", "muladd_2d_report",
           "lltm_forward_report", "H200_TUNE_US", "H200_COPY"]

#: The H200's device time (µs) per call of each candidate of the Tune copy, 16 Mi float32.
H200_TUNE_US = {
    (256, 1): 53.50, (128, 1): 82.46, (256, 2): 38.98, (128, 2): 43.03,
    (256, 4): 35.39, (128, 4): 34.57, (256, 8): 34.96, (128, 8): 35.04,
}
H200_CLONE_US = 34.72
H200_COPY = 3.71e12  #: the report's device-to-device copy in that run
N16 = 1 << 24


def copy_naive(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]


def copy_tuned(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a"), ITEMS: pnex.Tune(1, 2, 4, 8)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    v = cuda.local.array(ITEMS, float32)
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            v[k] = a[j]
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            result[j] = v[k]


def _timed(op, name, device, n, block, op_us, eager_us, copy, *, tuned=None, registers=12) -> PnexReport:
    """The report of ``op`` on ``n`` float32 elements as the GPU run measured it."""
    gpu = profile(device)
    base = pnex.build_report(op, arch=gpu.arch, sass=False)
    items = dict(tuned.candidates[tuned.choice].tune)["ITEMS"] if tuned is not None else 1
    threads = -(-n // items)
    grid = (-(-threads // block), 1, 1)
    moved = 8 * n
    facts = LaunchFacts(arch=gpu.arch, registers=registers, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                        block=(block, 1, 1), grid=grid, sm_count=gpu.sm_count, op_seconds=op_us * 1e-6,
                        bytes_moved=moved, x_extent=threads, input_bytes=4 * n, ceiling_bandwidth=copy,
                        tune=(("ITEMS", items),) if tuned is not None else (), element_bytes=4,
                        template=tune_template(op.spec, inspect.getsource(op.definition.fn)))
    # A copy is exact: what torch.randn's 16 Mi samples give (largest |value| about 5.3).
    correct = Correctness(0.0, 0.0, True, ("result",), 1.3e-6, 1e-5, "", f"cuda:0 (NVIDIA {device})", 5.3, n)
    timing = TimingResult(Measurement(100, 7, (op_us * 1e-4,) * 7), Measurement(100, 7, (eager_us * 1e-4,) * 7),
                          correct, moved, f"cuda:0 (NVIDIA {device})", name=name, eager_name="torch.clone")
    info = dataclasses.replace(gpu.info, name=f"NVIDIA {device}")
    kernel = dataclasses.replace(
        base, autotune=tuned, timing=timing, efficiency=assess(timing, info, copy, facts), block=(block, 1, 1),
        grid=grid, n_threads_values=(threads,), registers=registers,
    )
    return PnexReport.from_kernel(kernel, op, name, eager_text="torch.clone", args_text="(A,)")


def tuned_copy_report() -> PnexReport:
    """The ``Tune`` copy on an H200: 2 blocks × 4 ``ITEMS`` timed, 128 threads with
    ITEMS=4 chosen, at the copy's bandwidth (nothing to say)."""
    op = pnex.jit(n_threads="(a.numel() + ITEMS - 1) // ITEMS", threads_per_block=[256, 128])(copy_tuned)
    rows = tuple(autotune.CandidateResult((block,), us * 1e-6, tune=(("ITEMS", items),))
                 for (block, items), us in H200_TUNE_US.items())
    choice = min(range(len(rows)), key=lambda i: rows[i].seconds)
    tuned = autotune.TuneResult("copy_tuned", (N16,), "a.numel()=16777216 (sizes rounded up to powers of two), "
                                "contiguous inputs", rows, choice, "benchmarked", "NVIDIA H200", seconds_total=0.37)
    block = rows[choice].block[0]
    return _timed(op, "copy_tuned", "H200", N16, block, rows[choice].seconds * 1e6, H200_CLONE_US, H200_COPY,
                  tuned=tuned, registers=26)


def naive_copy_report() -> PnexReport:
    """One element per thread on an H200, blocks of 256: 53.5 µs, 0.68 of the copy: too
    few bytes in flight."""
    op = pnex.jit(n_threads="a.numel()")(copy_naive)
    return _timed(op, "copy_naive", "H200", N16, 256, H200_TUNE_US[256, 1], H200_CLONE_US, H200_COPY)


def small_blocks_report() -> PnexReport:
    """One element per thread on an H100, blocks of 128, 1 GiB read: the SMs start
    blocks as fast as they can, and the bytes in flight are short too ("also")."""
    op = pnex.jit(n_threads="a.numel()", threads_per_block=128)(copy_naive)
    return _timed(op, "copy_naive", "H100 SXM", 1 << 28, 128, 1278.8, 725.4, 2.86e12)


def gated(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        one = float32(1.0)
        out[i] = a[i] * (one / (one + math.exp(-b[i]))) + c[i]


def muladd(a: pnex.In("f32", (None, None)), b: pnex.In("f32", "a"), c: float, result: pnex.Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c


def lltm_forward(gates: pnex.In("f32", (None, None)), old_cell: pnex.In("f32", ("gates.size(0)", "gates.size(1) // 3")),
                 new_h: pnex.Out("f32", "old_cell"), new_cell: pnex.Out("f32", "old_cell")):
    s, b = cuda.grid(2)
    S = old_cell.shape[1]
    if b < old_cell.shape[0] and s < S:
        one = float32(1.0)
        input_gate = one / (one + math.exp(-gates[b, s]))
        output_gate = one / (one + math.exp(-gates[b, S + s]))
        z = gates[b, 2 * S + s]
        candidate_cell = z if z > 0 else math.exp(z) - one
        c = old_cell[b, s] + candidate_cell * input_gate
        new_cell[b, s] = c
        new_h[b, s] = math.tanh(c) * output_gate


def _recorded(fn, n_threads, device: str, *, block, grid, threads, op_us, eager_us, eager_name, moved, read, copy,
              registers, elements, graph_us=None, args_text="(a, b, c)") -> PnexReport:
    """The report of ``fn`` (compiled here for the GPU's architecture) as a GPU run measured it."""
    gpu = profile(device)
    op = pnex.jit(n_threads=n_threads, threads_per_block=block[:len(threads)])(fn)
    base = pnex.build_report(op, arch=gpu.arch, sass=False)
    facts = LaunchFacts(arch=gpu.arch, registers=registers, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                        block=block, grid=grid, sm_count=gpu.sm_count, op_seconds=op_us * 1e-6, bytes_moved=moved,
                        x_extent=threads[0], input_bytes=read, ceiling_bandwidth=copy, element_bytes=4,
                        template=tune_template(op.spec, inspect.getsource(fn)),
                        graph_seconds=None if graph_us is None else graph_us * 1e-6)
    where = f"cuda:0 (NVIDIA {device})"
    correct = Correctness(4.77e-7, 1e-7, True, ("result",), 1.3e-6, 1e-5, "", where, 7.2, elements)
    timing = TimingResult(Measurement(100, 7, (op_us * 1e-4,) * 7), Measurement(100, 7, (eager_us * 1e-4,) * 7),
                          correct, moved, where, name=fn.__name__, eager_name=eager_name)
    info = dataclasses.replace(gpu.info, name=f"NVIDIA {device}", peak_bandwidth=4.81e12, l2_bytes=60 << 20)
    kernel = dataclasses.replace(base, timing=timing, efficiency=assess(timing, info, copy, facts), block=block,
                                 grid=grid, n_threads_values=threads, registers=registers)
    return PnexReport.from_kernel(kernel, op, fn.__name__, eager_text=eager_name, args_text=args_text)


def gated_report() -> PnexReport:
    """The quickstart's fused ``a * sigmoid(b) + c`` on an H200: 73% of the copy, and none
    of the report's reasons shows (the report offers --profile)."""
    n = N16
    return _recorded(gated, "a.numel()", "H200", block=(256, 1, 1), grid=(n // 256, 1, 1), threads=(n,),
                     op_us=91.0, eager_us=134.0, eager_name="lambda a, b, c: a * torch.sigmoid(b) + c",
                     moved=16 * n, read=12 * n, copy=4.07e12, registers=25, elements=n)


def muladd_2d_report() -> PnexReport:
    """05_colab's 2-D ``a * b + c`` on 4096 × 4096 float32, blocks of 16 × 16, on an H200:
    72% of the copy, too few bytes in flight; the template is 2-D, as the kernel."""
    side = 4096
    return _recorded(muladd, ("result.size(1)", "result.size(0)"), "H200", block=(16, 16, 1), grid=(256, 256, 1),
                     threads=(side, side), op_us=71.8, eager_us=84.3, eager_name="lambda a, b, c: a * b + c",
                     moved=12 * side * side, read=8 * side * side, copy=3.91e12, registers=26, elements=side * side,
                     args_text="a, b, 0.5")


def lltm_forward_report(graph_us: float | None = None) -> PnexReport:
    """03_lltm's forward kernel at the tutorial's size (batch 16, state 128) on an H200:
    7.91 µs for 48 KiB, launch-bound; ``graph_us``: a CUDA-graph replay's time per call."""
    return _recorded(lltm_forward, ("old_cell.size(1)", "old_cell.size(0)"), "H200", block=(128, 2, 1),
                     grid=(1, 8, 1), threads=(128, 16), op_us=7.91, eager_us=58.4, eager_name="wl.lltm_cell_reference",
                     moved=49_152, read=32_768, copy=4.07e12, registers=31, elements=4096, graph_us=graph_us,
                     args_text="gates_example, cell_example")
