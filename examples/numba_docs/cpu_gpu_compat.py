"""A ``numba.jit`` function reused in a kernel: numba-cuda's ``test_ex_cpu_gpu_compat``
from ``doc_examples/test_cpu_gpu_compat.py``, ported to pnex.

``business_logic`` is an ordinary ``@numba.jit`` function (callable on the CPU, in
Python); the kernel calls it per element, and pnex compiles it as a device function
(on CPU tensors the simulator runs its Python).  The docs launch
``f.forall(len(X))(results, X, Y, Z)``: the output comes first, shaped like ``xarr``.
"""

from __future__ import annotations

import math

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "a numba.jit function called from a kernel (output first)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_cpu_gpu_compat.py: test_ex_cpu_gpu_compat, f"
GPU_ONLY = False
TOLERANCE = dict(rtol=1e-12, atol=1e-8)  # float64, room for a fused multiply-add in 2*x - t*pi


def define():
    from math import pi

    import numba
    from numba import cuda

    @numba.jit
    def business_logic(x, y, z):
        return 4 * z * (2 * x - (4 * y) / 2 * pi)

    @pnex.jit(n_threads="xarr.numel()")
    def f(
        res: pnex.Out("f64", "xarr"),
        xarr: pnex.In("i64", (None,)),
        yarr: pnex.In("i64", "xarr"),
        zarr: pnex.In("i64", "xarr"),
    ):
        tid = cuda.grid(1)
        if tid < len(xarr):
            # The function decorated with numba.jit may be directly reused
            res[tid] = business_logic(xarr[tid], yarr[tid], zarr[tid])

    return f


def _inputs(device: str, seed: int, n: int) -> list[torch.Tensor]:
    gen = generator(seed)
    return [torch.randint(-1000, 1000, (n,), generator=gen).to(device) for _ in range(3)]


def run(device: str, seed: int) -> tuple[dict, dict]:
    f = define()
    x, y, z = _inputs(device, seed, 3 if device == "cpu" else 10_000)
    xd, yd, zd = (t.cpu().double() for t in (x, y, z))
    return {"res": f(x, y, z)}, {"res": 4 * zd * (2 * xd - (4 * yd) / 2 * math.pi)}


def timed(device: str):
    f = define()
    x, y, z = _inputs(device, 0, 1 << 24)
    return (lambda: f(x, y, z)), (lambda: 4 * z * (2 * x - (4 * y) / 2 * math.pi))
