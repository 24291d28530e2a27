"""Kernels the artifact tests save and load (tests/test_artifact.py on CPU,
tests/test_artifact_gpu.py on a GPU): each factory defines its op again, under the
same op name, so a test that loaded an artifact over it gets it back."""

from __future__ import annotations

from numba import cuda

import pnex_magic as pnex


def make_rich():
    """InMut, three kinds of scalars, Unused, several outputs with init, a 2-D grid."""

    @pnex.jit(n_threads=("a.size(1)", "a.size(0)"), threads_per_block=(8, 4))
    def rich(
        a: pnex.In("f32", (None, None)),
        acc: pnex.InMut("f64", ("a.size(0)",)),
        scale: float,
        k: int,
        skip: pnex.Unused,
        flag: pnex.Scalar("bool"),
        out: pnex.Out("f32", "a"),
        counts: pnex.Out("i32", ("a.size(0) * k + 1",), init=0),
        rowmax: pnex.Out("f32", ("max(a.size(0), 1)",), init=-1.5),
    ):
        x, y = cuda.grid(2)
        if y < a.shape[0] and x < a.shape[1]:
            v = a[y, x] * scale
            out[y, x] = v if flag else -v
            cuda.atomic.add(acc, y, v)
            cuda.atomic.add(counts, y * k, 1)
            cuda.atomic.max(rowmax, y, v)

    return rich


def make_scale_pair():
    """(y, z) = (x * w + c, x * x), with its backward op attached (two incoming gradients)."""

    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def scale(
        x: pnex.In("f64", (None,)), w: pnex.In("f64", "x"), c: float, y: pnex.Out("f64", "x"), z: pnex.Out("f64", "x")
    ):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i] * w[i] + c
            z[i] = x[i] * x[i]

    @pnex.backward_of(scale)
    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def scale_backward(
        grad_y: pnex.In("f64", (None,)),
        grad_z: pnex.In("f64", "grad_y"),
        x: pnex.In("f64", "grad_y"),
        w: pnex.In("f64", "grad_y"),
        grad_x: pnex.Out("f64", "x"),
        grad_w: pnex.Out("f64", "x"),
    ):
        i = cuda.grid(1)
        if i < x.shape[0]:
            grad_x[i] = w[i] * grad_y[i] + 2.0 * x[i] * grad_z[i]
            grad_w[i] = x[i] * grad_y[i]

    return scale, scale_backward


def make_copy():
    @pnex.jit(n_threads="a.numel()")
    def copy1d(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    return copy1d
