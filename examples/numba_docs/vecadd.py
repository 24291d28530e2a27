"""Vector addition: numba-cuda's ``doc_examples/test_vecadd.py``, ported to pnex.

The kernel's body is the documentation's.  Its parameters are annotated (the output
``c`` becomes an ``Out`` that the op creates), and it is called the way the docs
launch it with ``f.forall(len(a))(a, b, c)``: one thread per element, the block
chosen by pnex.  ``from numba import cuda`` sits inside the defining function, as
in the documentation's test.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "vector addition (f.forall)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_vecadd.py: test_ex_vecadd, f"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # one float64 addition: exact


def define():
    from numba import cuda

    @pnex.jit(n_threads="c.numel()")
    def f(a: pnex.In("f64", (None,)), b: pnex.In("f64", "a"), c: pnex.Out("f64", "a")):
        # like threadIdx.x + (blockIdx.x * blockDim.x)
        tid = cuda.grid(1)
        size = len(c)

        if tid < size:
            c[tid] = a[tid] + b[tid]

    return f


def _inputs(device: str, seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(seed)
    a = torch.rand(n, dtype=torch.float64, generator=gen)
    b = torch.rand(n, dtype=torch.float64, generator=gen)
    return a.to(device), b.to(device)


def run(device: str, seed: int) -> tuple[dict, dict]:
    f = define()
    a, b = _inputs(device, seed, 100_000 if device != "cpu" else 1_000)
    c = f(a, b)
    return {"c": c}, {"c": a.cpu().double() + b.cpu().double()}


def timed(device: str):
    f = define()
    a, b = _inputs(device, 0, 1 << 24)
    return (lambda: f(a, b)), (lambda: torch.add(a, b))
