"""Cooperative groups, a grid-wide sync between rows: numba-cuda's
``doc_examples/test_cg.py`` (``sequential_rows``), ported to pnex.

The kernel's body is the documentation's: each thread owns a column; row ``r`` takes
row ``r - 1``'s mirrored column plus one, so every row reads what other blocks wrote
before the grid sync (``g.sync()``).  The docs type the matrix ``int32[:, ::1]`` and
launch ``sequential_rows[griddim, blockdim](A)`` with blocks of one warp (32 threads)
and ``griddim = A.shape[1] // blockdim``: the port pins the block to 32 and launches one
thread per column (``n_threads="M.size(1)"``), the same grid.  ``M`` is written in place
(``InMut``).  The docs start from zeros; here row 0 is random and the rows below it are
garbage, every one overwritten.
"""

from __future__ import annotations

import numpy as np
import torch

import pnex_magic as pnex

from _common import generator

TITLE = "cooperative groups: rows that read other blocks' columns after a grid sync"
SOURCE = "numba_cuda/numba/cuda/tests/doc_examples/test_cg.py: test_ex_grid_sync, sequential_rows"
GPU_ONLY = False
TOLERANCE = dict(rtol=0.0, atol=0.0)  # integers: exact


def define():
    from numba import cuda

    @pnex.jit(n_threads="M.size(1)", threads_per_block=32)  # blockdim = 32, griddim = A.shape[1] // blockdim
    def sequential_rows(M: pnex.InMut("i32", (None, None))):
        col = cuda.grid(1)
        g = cuda.cg.this_grid()

        rows = M.shape[0]
        cols = M.shape[1]

        for row in range(1, rows):
            opposite = cols - col - 1
            # Each row's elements are one greater than the previous row
            M[row, col] = M[row - 1, opposite] + 1
            # Wait until all threads have written their column element,
            # and that the write is visible to all other threads
            g.sync()

    return sequential_rows


def reference(first_row: np.ndarray, rows: int) -> np.ndarray:
    out = np.empty((rows, first_row.size), np.int64)
    out[0] = first_row
    for row in range(1, rows):
        out[row] = out[row - 1][::-1] + 1
    return out


def _size(device: str) -> int:
    # The docs' 1024 x 1024 (32 blocks of 32) on a GPU; 64 x 64 (2 blocks) in the simulator.
    return 1024 if device != "cpu" else 64


def _matrix(n: int, seed: int) -> torch.Tensor:
    # rows 1.. are garbage: every one is overwritten
    return torch.randint(-(2**20), 2**20, (n, n), generator=generator(seed), dtype=torch.int32)


def run(device: str, seed: int) -> tuple[dict, dict]:
    sequential_rows = define()
    a = _matrix(_size(device), seed)
    expected = reference(a[0].numpy().astype(np.int64), a.shape[0])
    m = a.to(device, copy=True)
    sequential_rows(m)
    return {"M": m}, {"M": torch.from_numpy(expected)}


def timed(device: str):
    sequential_rows = define()
    m = _matrix(_size(device), 0).to(device)

    def torch_rows():  # one flip and add per row
        for row in range(1, m.shape[0]):
            torch.add(m[row - 1].flip(0), 1, out=m[row])
        return m

    return (lambda: sequential_rows(m)), torch_rows
