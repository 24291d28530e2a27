"""A kernel calling a NumPy ufunc with the output first: numba-cuda's ``f`` from
``doc_examples/test_ufunc.py``, ported to pnex.

``f(r, x)`` writes ``np.sin(x)`` into ``r`` from a single thread, as the docs launch
it (``f[1, 1](r, x)``).  The output comes first in the signature and is shaped like
the input declared after it: ``r: Out("f32", "x")``.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "ufunc call, output first (np.sin(x, r))"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_ufunc.py: test_ex_cuda_ufunc_call, f"
GPU_ONLY = False
TOLERANCE = dict(rtol=1e-6, atol=1e-6)  # float32 sin (a few ulp) against float64


def define():
    import numpy as np

    @pnex.jit(n_threads=1, threads_per_block=1)
    def f(r: pnex.Out("f32", "x"), x: pnex.In("f32", (None,))):
        # Compute sin(x) with result written to r
        np.sin(x, r)

    return f


def _input(device: str, seed: int, n: int) -> torch.Tensor:
    return (torch.rand(n, generator=generator(seed)) * 10 - 5).to(device)


def run(device: str, seed: int) -> tuple[dict, dict]:
    f = define()
    x = _input(device, seed, 10 if device == "cpu" else 1000)
    return {"r": f(x)}, {"r": torch.sin(x.cpu().double())}


def timed(device: str):
    f = define()
    x = _input(device, 0, 1 << 14)  # one thread, as the docs launch it
    return (lambda: f(x)), (lambda: torch.sin(x))
