"""Matrix multiplication in shared-memory tiles: numba-cuda's ``fast_matmul`` from
``doc_examples/test_matmul.py``, ported to pnex.

The body is the documentation's: ``TPB`` is a global constant (frozen when the
kernel is defined), each block stages ``TPB x TPB`` tiles of ``A`` and ``B`` in
shared memory, and the number of tiles is ``cuda.gridDim.x``.  So the block is
pinned to ``(TPB, TPB)`` and the grid must cover ``max(A.size(1), B.size(1))``
columns and ``max(A.size(0), B.size(0))`` rows, which is how the docs size it for
their non-square case: ``n_threads`` says exactly that.  Integer-valued float32
inputs make the result exact.
"""

from __future__ import annotations

import torch

import pnex_magic as pnex

from _common import integer_matrices

TITLE = "matrix multiplication, shared-memory tiles (fast_matmul)"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_matmul.py: test_matmul, fast_matmul"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # integer-valued float32 inputs: every sum is exact


def define():
    from numba import cuda
    from numba.cuda import float32

    # Controls threads per block and shared memory usage.
    # The computation will be done on blocks of TPBxTPB elements.
    # TPB should not be larger than 32 in this example
    TPB = 16

    @pnex.jit(
        n_threads=("max(A.size(1), B.size(1))", "max(A.size(0), B.size(0))"),
        threads_per_block=(TPB, TPB),
    )
    def fast_matmul(
        A: pnex.In("f32", (None, None)),
        B: pnex.In("f32", ("A.size(1)", None)),
        C: pnex.Out("f32", ("A.size(0)", "B.size(1)")),
    ):
        """
        Perform matrix multiplication of C = A * B using CUDA shared memory.

        Reference: https://stackoverflow.com/a/64198479/13697228 by @RobertCrovella
        """
        # Define an array in the shared memory
        # The size and type of the arrays must be known at compile time
        sA = cuda.shared.array(shape=(TPB, TPB), dtype=float32)
        sB = cuda.shared.array(shape=(TPB, TPB), dtype=float32)

        x, y = cuda.grid(2)

        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        bpg = cuda.gridDim.x  # blocks per grid

        # Each thread computes one element in the result matrix.
        # The dot product is chunked into dot products of TPB-long vectors.
        tmp = float32(0.0)
        for i in range(bpg):
            # Preload data into shared memory
            sA[ty, tx] = 0
            sB[ty, tx] = 0
            if y < A.shape[0] and (tx + i * TPB) < A.shape[1]:
                sA[ty, tx] = A[y, tx + i * TPB]
            if x < B.shape[1] and (ty + i * TPB) < B.shape[0]:
                sB[ty, tx] = B[ty + i * TPB, x]

            # Wait until all threads finish preloading
            cuda.syncthreads()

            # Computes partial product on the shared memory
            for j in range(TPB):
                tmp += sA[ty, j] * sB[j, tx]

            # Wait until all threads finish computing
            cuda.syncthreads()
        if y < C.shape[0] and x < C.shape[1]:
            C[y, x] = tmp

    return fast_matmul


def run(device: str, seed: int) -> tuple[dict, dict]:
    fast_matmul = define()
    results, references = {}, {}
    # the docs' square and non-square cases, larger on a GPU
    shapes = {"square": (4, 4, 4), "nonsquare": (5, 23, 7)}
    if device != "cpu":
        shapes["large"] = (300, 200, 100)
    for name, (m, k, n) in shapes.items():
        a, b = integer_matrices(device, seed, m, k, n)
        results[name] = fast_matmul(a, b)
        references[name] = a.cpu().double() @ b.cpu().double()
    return results, references


def timed(device: str):
    fast_matmul = define()
    a, b = integer_matrices(device, 0, 2048, 2048, 2048)
    return (lambda: fast_matmul(a, b)), (lambda: torch.mm(a, b))
