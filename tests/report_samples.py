"""Reports as a GPU run shows them, made on CPU from figures recorded on GPUs, for tests of
their rendering (``tests/test_browser.py``, ``tests/test_efficiency.py``).  No
``from __future__ import annotations`` here: pnex evaluates the kernels' annotations.

Every figure is a measurement: the H200's from ``benchmarks/results/autotune-2026-11-23-2150.json``
(16 Mi float32: every candidate of the ``Tune`` copy, ``torch.clone`` 34.72 µs, the report's
copy 3.71 TB/s), the H100's from ``benchmarks/results/inflight-2026-11-25-h100.json`` (1 GiB
read: one element per thread in blocks of 128, 1.2788 ms) with the report's copy of 2.86 TB/s
(``benchmarks/results/logs-2026-11-25/eff.txt``).
"""

import dataclasses

from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic.efficiency import LaunchFacts, assess
from pnex_magic.launch import autotune
from pnex_magic.profiles import profile
from pnex_magic.render.report import PnexReport
from pnex_magic.timing import Correctness, Measurement, TimingResult

__all__ = ["tuned_copy_report", "naive_copy_report", "small_blocks_report", "H200_TUNE_US", "H200_COPY"]

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
                        tune=(("ITEMS", items),) if tuned is not None else (), element_bytes=4)
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
