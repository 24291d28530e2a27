"""The kernels of the checked variant's tests (tests/test_checked.py, tests/test_checked_simulator.py):
planted accesses out of bounds of each kind (1-D, 2-D, 3-D; ``Out``, ``InMut``, ``In``; shared and
local arrays; atomics; views; index tuples; chained subscripts), correct ones, and ``run_plain``
(a kernel run unchecked in the simulator)."""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

import pnex_magic as pnex
from toolchain import simulable


def run_plain(fn, grid, block, *args):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    wrapped = [FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args]
    FakeCUDAKernel(simulable(fn), device=False)[grid, block](*wrapped)


# ----------------------------------------------------------------------------- kernels


def copy(a, r):
    i = cuda.grid(1)
    if i < r.shape[0]:
        r[i + 1] = a[i]


def read_past(a, r):
    i = cuda.grid(1)
    if i < r.shape[0]:
        r[i] = a[i + 1]


def inmut_2d(u):
    x, y = cuda.grid(2)
    if y < u.shape[0] and x < u.shape[1]:
        u[x, y] += 1.0  # transposed: out of bounds on a non-square array


def out_3d(a, out):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x + 1] = a[z, y, x]


def in_3d(a, out):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x] = a[z, y + 1, x]


def in_2d(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y + 1, x]


TPB = 8


def shared_off_by_one(a, out):
    tile = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile[t] = a[i]
    cuda.syncthreads()
    out[i] = tile[t + 1]  # reads past the tile in the last thread


def local_array(a, out):
    i = cuda.grid(1)
    acc = cuda.local.array(4, float32)
    for k in range(4):
        acc[k] = a[i] * k
    out[i] = acc[i % 5]  # index 4 is out of bounds


def atomics(keys, counts, olds):
    i = cuda.grid(1)
    if i < keys.shape[0]:
        cuda.atomic.add(counts, keys[i], 1)
        olds[i] = cuda.atomic.add(counts, keys[i], 0) + 100


def negative(a, out, shift):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i - shift]  # -n <= i - shift < 0 counts from the end; below -n is out of bounds


def views(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        row = a[y + 1]  # a view: checked on axis 0, clamped to 0
        out[y, x] = row[x]


def tuple_index(a, out):
    x, y = cuda.grid(2)
    idx = (y, x + 1)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[idx]


def chained(a, out):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y][x] = a[y][x + 1]


def not_arrays(a, out):
    i = cuda.grid(1)
    t = (2.0, 3.0)
    mixed = (1, 0.5)
    shape = a.shape
    if i < out.shape[0]:
        out[i] = a[i] * t[i % 2] + mixed[0] + shape[0] + a[0:2][0]


@pnex.jit(n_threads="a.numel()")
def spec_kernel(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i]


def make_scaled(scale):
    def scaled(a, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = a[i] * scale

    return scaled


CALLS = {"n": 0}


def counted(i):
    CALLS["n"] += 1
    return i


def update_once(out):
    i = cuda.grid(1)
    out[counted(i)] += 1.0


def many(a, b, out):
    i = cuda.grid(1)
    out[i], b[i + 1] = a[i], a[i] * 2
    out[i] = b[i] = a[i] + 1
