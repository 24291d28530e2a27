"""Globals captured as constants: numba-cuda's ``test_ex_globals_constant_capture``
from ``doc_examples/test_globals.py``, ported to pnex.

``TAX_RATE`` and ``PRICES`` are local variables of the function that defines the
kernel (closure variables of the kernel), changed after the first call: the docs
show that the second call still uses the original values, because Numba bakes them
into the code.  pnex takes one snapshot of them when the kernel is defined, and every
form of the kernel is built from it: the first call, the call after the change, a
call on a strided view (which compiles another layout variant after the change), and
the CPU simulator all see ``TAX_RATE = 0.08`` and the original ``PRICES``.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

from _common import generator

TITLE = "globals captured as constants (closure, changed after the first call)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_globals.py: test_ex_globals_constant_capture, compute_totals"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # the same two float64 products, in the same order


def run(device: str, seed: int) -> tuple[dict, dict]:
    from numba import cuda

    TAX_RATE = 0.08
    PRICES = np.array([10.0, 25.0, 5.0, 15.0, 30.0], dtype=np.float64)
    original = torch.tensor([10.0, 25.0, 5.0, 15.0, 30.0], dtype=torch.float64)  # the reference's own copy

    @pnex.jit(n_threads="totals.numel()")
    def compute_totals(quantities: pnex.In("f64", (5,)), totals: pnex.Out("f64", "quantities")):
        i = cuda.grid(1)
        if i < totals.size:
            totals[i] = quantities[i] * PRICES[i] * (1 + TAX_RATE)

    gen = generator(seed)
    d_quantities = torch.randint(1, 10, (5,), generator=gen).double().to(device)
    strided = torch.randint(1, 10, (10,), generator=gen).double().to(device)[::2]

    # First kernel call - captures values
    first = compute_totals(d_quantities)

    # These modifications have no effect on subsequent kernel calls
    TAX_RATE = 0.10  # noqa: F841
    PRICES[:] = [20.0, 50.0, 10.0, 30.0, 60.0]

    # Second kernel call still uses the original values; so does a strided input,
    # whose layout variant is compiled only now
    second = compute_totals(d_quantities)
    on_view = compute_totals(strided)
    results = {"first": first, "after_change": second, "strided_after_change": on_view}
    references = {
        "first": d_quantities.cpu() * original * (1 + 0.08),
        "after_change": d_quantities.cpu() * original * (1 + 0.08),
        "strided_after_change": strided.cpu() * original * (1 + 0.08),
    }
    return results, references


def timed(device: str):
    from numba import cuda

    TAX_RATE = 0.08
    PRICES = np.linspace(1.0, 100.0, 4096)  # baked into the code: a 32 KiB constant table

    @pnex.jit(n_threads="totals.numel()")
    def compute_totals(quantities: pnex.In("f64", (4096,)), totals: pnex.Out("f64", "quantities")):
        i = cuda.grid(1)
        if i < totals.size:
            totals[i] = quantities[i] * PRICES[i] * (1 + TAX_RATE)

    q = torch.rand(4096, dtype=torch.float64, device=device)
    prices = torch.from_numpy(PRICES).to(device)
    return (lambda: compute_totals(q)), (lambda: q * prices * (1 + TAX_RATE))
