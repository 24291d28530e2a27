"""A device array as a global, read by reference: numba-cuda's
``test_ex_globals_device_array_capture`` from ``doc_examples/test_globals.py``,
ported to pnex.

``PRICES`` is a device array (the docs' ``cuda.to_device``; also a torch tensor) that
the kernel reads as a global.  pnex passes it to the kernel at every launch as a
hidden argument (its address is never in the code, so the compile cache stays valid
in a new process), so an in-place update between calls is seen by the next call, as
Numba promises for device arrays.  On CPU tensors the global is a CPU torch tensor,
which the simulator reads in place.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "a device array as a global (updated in place between calls)"
SOURCE = (
    "numba_cuda/numba/cuda/tests/doc_examples/test_globals.py: test_ex_globals_device_array_capture, compute_totals"
)
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # one float32 product: the float64 reference rounded once


def _session(device: str, seed: int, PRICES, update) -> tuple[list, list]:
    """The docs' two calls around an in-place update of ``PRICES`` (``update(values)``)."""
    from numba import cuda

    @pnex.jit(n_threads="totals.numel()")
    def compute_totals(quantities: pnex.In("f32", (None,)), totals: pnex.Out("f32", "quantities")):
        i = cuda.grid(1)
        if i < totals.size:
            totals[i] = quantities[i] * PRICES[i]

    gen = generator(seed)
    d_quantities = torch.randint(1, 10, (5,), generator=gen).float().to(device)
    before = torch.rand(5, generator=gen) * 100
    after = torch.rand(5, generator=gen) * 100
    update(before)
    first = compute_totals(d_quantities)  # First kernel call
    update(after)  # Mutate the device array in-place
    second = compute_totals(d_quantities)  # Second kernel call sees the updated values
    q = d_quantities.cpu().double()
    # float64 products of float32 values are exact; rounded once, as the kernel's float32 product is
    return [first, second], [(q * before.double()).float(), (q * after.double()).float()]


def run(device: str, seed: int) -> tuple[dict, dict]:
    results, references = {}, {}
    # A torch tensor on the call's device (on CPU tensors: a CPU tensor the simulator reads)
    prices = torch.zeros(5, dtype=torch.float32, device=device)
    got, want = _session(device, seed, prices, lambda values: prices.copy_(values))
    results.update(torch_first=got[0], torch_after_update=got[1])
    references.update(torch_first=want[0], torch_after_update=want[1])
    if device != "cpu":  # the docs' own form: a Numba device array, updated with copy_to_device
        import numpy as np
        from numba import cuda

        d_prices = cuda.to_device(np.zeros(5, dtype=np.float32))
        got, want = _session(device, seed + 1, d_prices, lambda values: d_prices.copy_to_device(values.numpy()))
        results.update(numba_first=got[0], numba_after_update=got[1])
        references.update(numba_first=want[0], numba_after_update=want[1])
    return results, references


def timed(device: str):
    from numba import cuda

    n = 1 << 24
    PRICES = torch.rand(n, device=device)

    @pnex.jit(n_threads="totals.numel()")
    def compute_totals(quantities: pnex.In("f32", (None,)), totals: pnex.Out("f32", "quantities")):
        i = cuda.grid(1)
        if i < totals.size:
            totals[i] = quantities[i] * PRICES[i]

    q = torch.rand(n, device=device)
    return (lambda: compute_totals(q)), (lambda: q * PRICES)
