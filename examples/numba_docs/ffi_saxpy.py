"""CUDA C++ with include folders: numba-cuda's ``test_ex_extra_includes`` from
``doc_examples/test_ffi.py``, ported to pnex.

``saxpy`` (``ffi/saxpy.cu``) includes ``add.cuh`` and ``mul.cuh``, found through
``numba.cuda.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS`` as the docs set it (the headers
are copied into ``ffi/include``).  The docs launch ``vector_saxpy[num_blocks, 32]``;
here ``n_threads`` covers ``res`` with blocks of 32.  The CUDA simulator cannot run
CUDA C++: on CPU tensors the call raises ``KernelLaunchError`` naming ``saxpy``.
"""

from __future__ import annotations

import os

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "CUDA C++ with extra include folders (saxpy)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_ffi.py: test_ex_extra_includes, vector_saxpy"
GPU_ONLY = True
TOLERANCE = dict(rtol=2**-22, atol=1e-6)  # float32 a*x + y: a product and a sum (or one FMA)
FOREIGN = "saxpy"


def define():
    from numba import cuda
    from numba.cuda import config

    basedir = os.path.dirname(os.path.abspath(__file__))
    include = os.path.join(basedir, "ffi", "include")
    saxpy_cu = os.path.join(basedir, "ffi", "saxpy.cu")

    config.CUDA_NVRTC_EXTRA_SEARCH_PATHS = include  # the docs: mul.cuh's and add.cuh's folders

    sig = "float32(float32, float32, float32)"
    saxpy = cuda.declare_device("saxpy", sig=sig, link=saxpy_cu)

    @pnex.jit(n_threads="res.numel()", threads_per_block=32)
    def vector_saxpy(a: float, x: pnex.In("f32", (None,)), y: pnex.In("f32", "x"), res: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < len(res):
            res[i] = saxpy(a, x[i], y[i])

    return vector_saxpy


def run(device: str, seed: int) -> tuple[dict, dict]:
    vector_saxpy = define()
    gen = generator(seed)
    size = 100 if device == "cpu" else 10_000
    a = float(torch.rand((), generator=gen) * 4)
    X, Y = torch.rand(size, generator=gen).to(device), torch.rand(size, generator=gen).to(device)
    a32 = float(torch.tensor(a, dtype=torch.float32))  # the kernel's float32 a
    return {"res": vector_saxpy(a, X, Y)}, {"res": a32 * X.cpu().double() + Y.cpu().double()}


def timed(device: str):
    vector_saxpy = define()
    X, Y = torch.rand(1 << 24, device=device), torch.rand(1 << 24, device=device)
    return (lambda: vector_saxpy(3.0, X, Y)), (lambda: torch.add(Y, X, alpha=3.0))
