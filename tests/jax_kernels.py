"""The kernels the JAX front end's tests share (tests/test_jax.py, test_jax_grad.py, test_jax_ffi.py),
with ``randn`` (fresh inputs every run) and the ``x64`` fixture (64-bit JAX types for one test)."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in one process

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba import cuda  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import pnex_magic as pnex  # noqa: E402


def rng():
    return np.random.default_rng()  # fresh inputs every run


def randn(*shape, dtype=np.float32):
    return jnp.asarray(rng().standard_normal(shape).astype(dtype))


@pytest.fixture
def x64():
    """64-bit JAX types for one test."""
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


# ------------------------------------------------------------------------------- kernels


@pnex.jit(n_threads=("result.size(1)", "result.size(0)"), threads_per_block=(8, 4))
def muladd(
    a: pnex.In("f32", (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: pnex.Out("f32", "a"),
):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def accumulate(
    a: pnex.In("f32", (None,)),
    m: pnex.InMut("f32", "a"),
    c: float,
    hist: pnex.Out("i32", (4,), init=0),
    even: pnex.Out("f32", "a", init=1.5),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        m[i] += a[i] * c
        cuda.atomic.add(hist, i % 4, 1)
        if i % 2 == 0:
            even[i] = a[i]


@pnex.jit(n_threads="out.numel()", threads_per_block=32)
def repeat(a: pnex.In("f32", (None,)), k: int, flag: bool, out: pnex.Out("f32", ("a.size(0) * k",))):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i // k] if flag else -a[i // k]


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def bf16_axpy(a: pnex.In("bf16", (None,)), s: pnex.Scalar("bf16"), out: pnex.Out("bf16", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * s + a[i]


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def cube(x: pnex.In("f64", (None,)), w: pnex.In("f64", "x"), c: pnex.Scalar("f64"), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * x[i] * x[i] * w[i] + c


@pnex.backward_of(cube)
@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def cube_backward(
    grad_y: pnex.In("f64", (None,)),
    x: pnex.In("f64", "grad_y"),
    w: pnex.In("f64", "grad_y"),
    grad_x: pnex.Out("f64", "x"),
    grad_w: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        grad_x[i] = 3 * x[i] * x[i] * w[i] * grad_y[i]
        grad_w[i] = x[i] * x[i] * x[i] * grad_y[i]


def cube_reference(x, w, c):
    return x * x * x * w + c
