"""Reports as a GPU run would show them, made on CPU from recorded figures, for tests of
their rendering (``tests/test_browser.py``).  No ``from __future__ import annotations``
here: pnex evaluates the kernels' annotations."""

import dataclasses

import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.efficiency import Efficiency, LaunchFacts, reasons
from pnex_magic.launch import autotune
from pnex_magic.render.report import PnexReport
from pnex_magic.timing import Measurement, TimingResult

__all__ = ["timed_tune_report"]


def copy_tuned(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i]


def timed_tune_report() -> PnexReport:
    """A copy with a ``Tune`` parameter: its candidate table (2 blocks × 4 ITEMS, one
    skipped) and tuning time, and timings at the recorded figures of an H200 (one element
    per thread: 2.72 TB/s against a 4.0 TB/s copy), so that the Timing tab gives the
    reason, the advice and its code, and the other reasons under "also"."""
    op = pnex.jit(n_threads="a.numel()")(copy_tuned)
    base = pnex.build_report(op, args=(torch.arange(8, dtype=torch.float32),), eager=torch.clone, sass=False)
    rows = [autotune.CandidateResult((block,), 12.3e-6 / items ** 0.25, tune=(("ITEMS", items),))
            for block in (256, 128) for items in (1, 2, 4, 8)]
    rows[7] = dataclasses.replace(rows[7], seconds=None, skipped="results differ from the first candidate's")
    tuned = autotune.TuneResult("copy_tuned", (1 << 22,), "a.numel()=4194304 (sizes rounded up to powers of two), "
                                "contiguous inputs", tuple(rows), 3, "benchmarked", "NVIDIA H200", seconds_total=1.42)
    n = 1 << 22
    facts = LaunchFacts(arch="sm_90", registers=12, shared_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                        block=(256, 1, 1), grid=(n // 256, 1, 1), sm_count=132, op_seconds=8 * n / 2.72e12,
                        bytes_moved=8 * n, x_extent=n, input_bytes=4 * n, ceiling_bandwidth=4.0e12)
    found = reasons(facts) + reasons(dataclasses.replace(facts, spill_store_bytes=16, spill_load_bytes=16))[1:]
    timing = TimingResult(Measurement(100, 7, (8 * n / 2.72e12 * 100,) * 7),
                          Measurement(100, 7, (8 * n / 4.37e12 * 100,) * 7), base.timing.correctness, 8 * n, "cuda:0")
    e = Efficiency(op_bandwidth=timing.bandwidth, eager_bandwidth=timing.eager_bandwidth, copy_bandwidth=4.0e12,
                   peak_bandwidth=4.8e12, peak_source="memory clock 2619 MHz × 6144-bit bus × 2 (DDR)",
                   device="NVIDIA H200", bytes_moved=8 * n, l2_bytes=60 << 20, reasons=found,
                   dram_latency=facts.latency, latency_source="GH200: 689 cycles at 1980 MHz")
    kernel = dataclasses.replace(base, autotune=tuned, timing=timing, efficiency=e)
    return PnexReport.from_kernel(kernel, op, "copy_tuned", eager_text="torch.clone", args_text="(A,)")
