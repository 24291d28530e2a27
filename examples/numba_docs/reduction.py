"""A shared-memory sum: numba-cuda's ``array_sum`` from ``doc_examples/test_reduction.py``,
ported to pnex.

The body is the documentation's: one block of ``nelem`` threads adds ``data`` in a
shared array of ``nelem`` int32 and writes the sum to ``data[0]``.  ``nelem`` is the
data's length read when the kernel is defined (a closure variable, frozen then), so
the block is pinned to it: the docs launch ``array_sum[1, nelem](a)``.  ``data`` is
written in place, so it is an ``InMut``.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "shared-memory reduction (array_sum)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_reduction.py: test_ex_reduction, array_sum"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # integers: exact


def define(nelem: int):
    from numba import cuda
    from numba.cuda.types import int32

    @pnex.jit(n_threads="data.numel()", threads_per_block=nelem)
    def array_sum(data: pnex.InMut("i64", (nelem,))):
        tid = cuda.threadIdx.x
        size = len(data)
        if tid < size:
            i = cuda.grid(1)

            # Declare an array in shared memory
            shr = cuda.shared.array(nelem, int32)
            shr[tid] = data[i]

            # Ensure writes to shared memory are visible
            # to all threads before reducing
            cuda.syncthreads()

            s = 1
            while s < cuda.blockDim.x:
                if tid % (2 * s) == 0:
                    # Stride by `s` and add
                    shr[tid] += shr[tid + s]
                s *= 2
                cuda.syncthreads()

            # After the loop, the zeroth  element contains the sum
            if tid == 0:
                data[tid] = shr[tid]

    return array_sum


def run(device: str, seed: int) -> tuple[dict, dict]:
    nelem = 1024 if device != "cpu" else 128  # the simulator runs a Python thread per CUDA thread
    array_sum = define(nelem)
    data = torch.randint(0, 1000, (nelem,), generator=generator(seed), dtype=torch.int64)
    expected = data.clone()
    expected[0] = data.sum()
    a = data.to(device)
    array_sum(a)
    return {"data": a}, {"data": expected}


def timed(device: str):
    array_sum = define(1024)
    data = torch.randint(0, 1000, (1024,), generator=generator(0), dtype=torch.int64).to(device)
    return (lambda: array_sum(data)), (lambda: data.sum())
