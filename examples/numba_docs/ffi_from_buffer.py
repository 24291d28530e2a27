"""A foreign function taking a pointer from ``ffi.from_buffer``: numba-cuda's
``test_ex_from_buffer`` from ``doc_examples/test_ffi.py``, ported to pnex.

``sum_reduce`` (``ffi/functions.cu``) sums an array through a ``float*`` that the
kernel makes with CFFI's ``ffi.from_buffer(array)``; one thread writes the sum into a
0-d output (``result[()] = ...``).  The CUDA simulator cannot run CUDA C++: on CPU
tensors the call raises ``KernelLaunchError`` naming ``sum_reduce``.  Needs ``cffi``.
"""

from __future__ import annotations

import os

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "CUDA C++ on a pointer from ffi.from_buffer"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_ffi.py: test_ex_from_buffer, reduction_caller"
GPU_ONLY = True
REQUIRES = ("cffi",)
TOLERANCE = dict(rtol=2**-24, atol=0.0)  # a float64 sum in C++, rounded once to float32
FOREIGN = "sum_reduce"


def define():
    from numba import cuda

    basedir = os.path.dirname(os.path.abspath(__file__))
    functions_cu = os.path.join(basedir, "ffi", "functions.cu")

    signature = "float32(CPointer(float32), int32)"
    sum_reduce = cuda.declare_device("sum_reduce", signature, link=functions_cu)

    import cffi

    ffi = cffi.FFI()

    @pnex.jit(n_threads=1, threads_per_block=1)
    def reduction_caller(result: pnex.Out("f32", ()), array: pnex.In("f32", (None,))):
        array_ptr = ffi.from_buffer(array)
        result[()] = sum_reduce(array_ptr, len(array))

    return reduction_caller


def run(device: str, seed: int) -> tuple[dict, dict]:
    reduction_caller = define()
    x = torch.rand(10 if device == "cpu" else 10_000, generator=generator(seed)).to(device)
    return {"result": reduction_caller(x)}, {"result": x.cpu().double().sum()}


def timed(device: str):
    reduction_caller = define()
    x = torch.rand(1 << 16, device=device)  # one thread sums it, as the docs launch it
    return (lambda: reduction_caller(x)), (lambda: x.sum())
