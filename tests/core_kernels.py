"""The kernels of the compiler core's end-to-end tests (tests/test_core_*.py), defined once:
each test file runs some of them, and tests/test_core_ops.py opchecks them all.  Also
``rand`` (seeded inputs), ``muladd_ref`` and ``SENTINEL``."""

import numba
import torch
from numba import cuda

import pnex_magic as pnex


SENTINEL = -7.0


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


# --------------------------------------------------------------------------------------
# The API document's examples, verbatim apart from the module name.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="a.numel()")
def copy(
    a: pnex.In(dtype="f32", shape=(None,)),
    result: pnex.Out(dtype="f32", shape="a"),
):
    x = cuda.grid(1)
    if x < a.shape[0]:
        result[x] = a[x]


# Can be invoked as mymuladd_2d(A, B, C) to return RESULT
@pnex.jit(n_threads="result.numel()")
def mymuladd_2d(
    a: pnex.In(torch.float32, (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,  # : pnex.Scalar(float)
    result: pnex.Out("float32", "a"),
):
    idx = cuda.grid(1)
    y, x = divmod(idx, result.shape[0])
    if y < result.shape[0]:
        result[y, x] = a[y, x] * b[y, x] + c


@pnex.jit(n_threads=("result.size(1)", "result.size(0)"), to_extension=True)
def mymuladd_grid(
    a: pnex.In("f32", (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: pnex.Out("f32", "a"),
):
    # always use this order for names to be consistent with CUDA terminology:
    x, y = cuda.grid(2)

    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c


# mymuladd_2d's body, with an output that starts as a sentinel, to show which
# elements the document's indexing (divmod by the number of *rows*) writes.
@pnex.jit(n_threads="result.numel()")
def mymuladd_2d_marked(
    a: pnex.In(torch.float32, (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: pnex.Out("float32", "a", init=SENTINEL),
):
    idx = cuda.grid(1)
    y, x = divmod(idx, result.shape[0])
    if y < result.shape[0]:
        result[y, x] = a[y, x] * b[y, x] + c


def muladd_ref(a, b, c):
    return (a.double() * b.double() + c).float()


# --------------------------------------------------------------------------------------
# The kernels that tests/test_core_features.py and tests/test_core_ops.py run (and opcheck).
# --------------------------------------------------------------------------------------

TILE = 8
HALO_TILE = TILE + 2


@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=(TILE, TILE))
def laplacian(u: pnex.In("f64", (None, None)), out: pnex.Out("f64", "u")):
    tile = cuda.shared.array((HALO_TILE, HALO_TILE), numba.float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    x, y = cuda.grid(2)
    h = u.shape[0]
    w = u.shape[1]
    # The block's threads load its tile plus the halo; zero outside the domain.
    for j in range(ty, HALO_TILE, TILE):
        for i in range(tx, HALO_TILE, TILE):
            gy = cuda.blockIdx.y * TILE + j - 1
            gx = cuda.blockIdx.x * TILE + i - 1
            v = 0.0
            if 0 <= gy < h and 0 <= gx < w:
                v = u[gy, gx]
            tile[j, i] = v
    cuda.syncthreads()
    if y < h and x < w:
        out[y, x] = (
            tile[ty, tx + 1]
            + tile[ty + 2, tx + 1]
            + tile[ty + 1, tx]
            + tile[ty + 1, tx + 2]
            - 4.0 * tile[ty + 1, tx + 1]
        )


NBINS = 16


@pnex.jit(n_threads="x.numel()")
def histogram(x: pnex.In("i64", (None,)), hist: pnex.Out("i32", (NBINS,), init=0)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(hist, x[i], 1)


@pnex.jit(n_threads="a.numel()")
def stats3(
    a: pnex.In("f64", (None,)),
    b: pnex.In("f64", "a"),
    total: pnex.Out("f64", "a"),
    bigger: pnex.Out("i32", ("a.size(0)",)),
    n_bigger: pnex.Out("i64", (1,), init=0),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        total[i] = a[i] + b[i]
        if a[i] > b[i]:
            bigger[i] = 1
            cuda.atomic.add(n_bigger, 0, 1)
        else:
            bigger[i] = 0


@pnex.jit(n_threads="y.numel()")
def fill_double(a: pnex.In("f64", (None,)), y: pnex.InMut("f64", "a")):
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = 2.0 * a[i]


@pnex.jit(n_threads="x.numel()")
def scale_and_sum(
    x: pnex.InMut("f64", (None,)),
    s: pnex.Scalar("f64"),
    total: pnex.Out("f64", (1,), init=0),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] = x[i] * s
        cuda.atomic.add(total, 0, x[i])


WITH_INDEX = False


@pnex.jit(n_threads="a.numel()")
def double_maybe_index(
    a: pnex.In("f32", (None,)),
    out: pnex.Out("f32", "a"),
    idx: pnex.Out("i64", "a") if WITH_INDEX else pnex.Unused,
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * 2
        if WITH_INDEX:
            idx[i] = i


@pnex.jit(n_threads=("out.size(2)", "out.size(1)", "out.size(0)"), threads_per_block=(4, 4, 2))
def add_position(a: pnex.In("f32", (None, None, None)), out: pnex.Out("f32", "a")):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x] = a[z, y, x] + 100 * z + 10 * y + x


@pnex.jit(n_threads="out.numel()", threads_per_block=32)
def iota(n: int, start: int, out: pnex.Out("i64", ("n * 2",), init=-1)):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = start + i


@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=(8, 8))
def copy_2d(a: pnex.In("f32", (None, None)), out: pnex.Out("f32", "a", init=SENTINEL)):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x]


@cuda.jit(device=True)
def _cube(v):
    return v * v * v


@pnex.jit(n_threads="a.numel()")
def cube_plus_one(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = _cube(a[i]) + 1
