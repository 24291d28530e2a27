"""CUDA C++ linked into a kernel: numba-cuda's ``test_ex_linking_cu`` from
``doc_examples/test_ffi.py``, ported to pnex.

``mul`` is a foreign function declared with ``cuda.declare_device`` and linked from
``ffi/functions.cu`` (the documentation's file, copied here); pnex's nvJitLink pass
compiles and links it.  The CUDA simulator cannot run CUDA C++, so on CPU tensors
the call raises ``KernelLaunchError`` naming ``mul_f32_f32``: this example runs on
a GPU only.
"""

from __future__ import annotations

import os

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "CUDA C++ through declare_device(link=...)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_ffi.py: test_ex_linking_cu, multiply_vectors"
GPU_ONLY = True
TOLERANCE = dict(rtol=2**-24, atol=0.0)  # one float32 product, rounded once
FOREIGN = "mul_f32_f32"  # what the refusal on CPU tensors names


def define():
    from numba import cuda

    # Path to the source containing the foreign function
    # (here assumed to be in a subdirectory called "ffi")
    basedir = os.path.dirname(os.path.abspath(__file__))
    functions_cu = os.path.join(basedir, "ffi", "functions.cu")

    # Declaration of the foreign function
    mul = cuda.declare_device("mul_f32_f32", "float32(float32, float32)", link=functions_cu)

    # A kernel that calls mul; functions.cu is linked automatically due to
    # the call to mul.
    @pnex.jit(n_threads="r.numel()")
    def multiply_vectors(r: pnex.Out("f32", "x"), x: pnex.In("f32", (None,)), y: pnex.In("f32", "x")):
        i = cuda.grid(1)

        if i < len(r):
            r[i] = mul(x[i], y[i])

    return multiply_vectors


def _inputs(device: str, seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = generator(seed)
    return torch.rand(n, generator=gen).to(device), torch.rand(n, generator=gen).to(device)


def run(device: str, seed: int) -> tuple[dict, dict]:
    multiply_vectors = define()
    x, y = _inputs(device, seed, 32 if device == "cpu" else 100_000)
    return {"r": multiply_vectors(x, y)}, {"r": x.cpu().double() * y.cpu().double()}


def timed(device: str):
    multiply_vectors = define()
    x, y = _inputs(device, 0, 1 << 24)
    return (lambda: multiply_vectors(x, y)), (lambda: x * y)
