"""A kernel that took a raw pointer: numba-cuda's ``add_one`` from
``doc_examples/test_cpointer.py``, ported to pnex.

The docs compile ``add_one`` for ``void(CPointer(uint8), uint32)`` and launch it on
``x.__cuda_array_interface__["data"][0]``.  A raw pointer cannot come from PyTorch
(pnex refuses a ``CPointer`` annotation, saying so): the port passes the tensor
itself as an ``InMut`` (the body indexes it the same way, ``x[i] += 1``) and the
length as a ``uint32`` scalar, launched as the docs launch it, one block of 32
threads.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import generator

TITLE = "raw pointer kernel, the pointer as an InMut tensor (add_one)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_cpointer.py: test_ex_cpointer, add_one"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # uint8 arithmetic: exact (wrapping at 256)


def define():
    from numba import cuda

    @pnex.jit(n_threads=32, threads_per_block=32)
    def add_one(x: pnex.InMut("u8", (None,)), n: pnex.Scalar("u32")):
        i = cuda.grid(1)
        if i < n:
            x[i] += 1

    return add_one


def run(device: str, seed: int) -> tuple[dict, dict]:
    add_one = define()
    gen = generator(seed)
    size = int(torch.randint(10, 33, (1,), generator=gen))
    x = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
    expected = ((x.long() + 1) % 256).to(torch.uint8)
    d_x = x.to(device)
    add_one(d_x, len(d_x))  # Launch the kernel with the tensor and length
    return {"x": d_x}, {"x": expected}


def timed(device: str):
    add_one = define()
    x = torch.zeros(32, dtype=torch.uint8, device=device)
    return (lambda: add_one(x, 32)), (lambda: x.add_(1))
