"""Matrix multiplication, one thread per result: numba-cuda's ``matmul`` from
``doc_examples/test_matmul.py``, ported to pnex.

The body is the documentation's (a float accumulator, ``C[i, j]`` with
``i, j = cuda.grid(2)``, so ``i`` runs along X: rows of ``C``).  The docs launch a
grid of 16 x 16 blocks over ``C``'s shape; here ``n_threads`` says the same.
Inputs are small integers in float32, so every product and sum is exact and the
result must equal a float64 reference bit for bit.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import integer_matrices

TITLE = "matrix multiplication, naive (matmul)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_matmul.py: test_matmul, matmul"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # integer-valued float32 inputs: every sum is exact


def define():
    from numba import cuda

    @pnex.jit(n_threads=("C.size(0)", "C.size(1)"), threads_per_block=(16, 16))
    def matmul(
        A: pnex.In("f32", (None, None)),
        B: pnex.In("f32", ("A.size(1)", None)),
        C: pnex.Out("f32", ("A.size(0)", "B.size(1)")),
    ):
        """Perform square matrix multiplication of C = A * B."""
        i, j = cuda.grid(2)
        if i < C.shape[0] and j < C.shape[1]:
            tmp = 0.0
            for k in range(A.shape[1]):
                tmp += A[i, k] * B[k, j]
            C[i, j] = tmp

    return matmul


def run(device: str, seed: int) -> tuple[dict, dict]:
    matmul = define()
    a, b = integer_matrices(device, seed, *((300, 200, 100) if device != "cpu" else (9, 23, 7)))
    return {"C": matmul(a, b)}, {"C": a.cpu().double() @ b.cpu().double()}


def timed(device: str):
    matmul = define()
    a, b = integer_matrices(device, 0, 2048, 2048, 2048)
    return (lambda: matmul(a, b)), (lambda: torch.mm(a, b))
