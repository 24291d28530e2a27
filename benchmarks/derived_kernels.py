"""The forward kernels of issue 28 with their backward derived by pnex
(``backward="auto"``), hand-written backward kernels to compare with, and the same
computations in PyTorch (the references the tests compare with).

Made per dtype by :func:`kernels` (float64 for ``gradcheck``; float32 on the GPU;
float16/bfloat16 for the half-type tests), as :mod:`workloads` makes the LLTM's.  Used
by tests/test_adjoint.py, tests/test_adjoint_gpu.py and benchmarks/derived_backward.py.
"""


import math
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numba
import torch
from numba import cuda

import pnex_magic as pnex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # noqa: E402


class Kernels(NamedTuple):
    muladd: Any  #: (a, b, c) -> a * b + c
    elementwise: Any  #: (x, w, c) -> (y, z): a branch, math functions, two outputs
    stencil: Any  #: (u, k) -> out: a 2-D 5-point stencil (gathers: atomics)
    rowsq: Any  #: (x, w) -> r: r[i] = sum_k w[k] * x[i, k]**2 (a row-wise loop)
    lltm: Any  #: (gates, old_cell) -> (new_h, new_cell): notebooks/03_lltm's forward (float32, float64)


_made: dict = {}


def _types(dtype: torch.dtype) -> tuple[torch.dtype, Any, str]:
    """The tensors' dtype, the float type of the kernels' arithmetic (float32 for the half
    types), and the suffix of the ops' names (one op per dtype)."""
    return dtype, numba.float32 if dtype != torch.float64 else numba.float64, "_" + str(dtype).removeprefix("torch.")


def kernels(dtype: torch.dtype = torch.float64, threads: int = 32) -> Kernels:
    """The four forward kernels for ``dtype``, each with its derived backward attached."""
    key = (dtype, threads)
    if key in _made:
        return _made[key]
    DT, real, suffix = _types(dtype)

    def elementwise(x: pnex.In(DT, (None,)), w: pnex.In(DT, "x"), c: pnex.Scalar("f32"),
                    y: pnex.Out(DT, "x"), z: pnex.Out(DT, "x")):
        i = cuda.grid(1)
        if i >= x.shape[0]:
            return
        v = real(x[i])
        one = real(1.0)
        if v > 0:
            t = math.exp(-v) * w[i] + math.sqrt(v)
        else:
            t = math.tanh(v) * w[i] ** 2 - c
        y[i] = t * math.log1p(w[i] * w[i])
        z[i] = max(v, real(w[i])) + abs(v) / (one + w[i] * w[i])

    def stencil(u: pnex.In(DT, (None, None)), k: pnex.Scalar("f32"), out: pnex.Out(DT, "u")):
        j, i = cuda.grid(2)
        n, m = u.shape
        if i < n and j < m:
            if 0 < i < n - 1 and 0 < j < m - 1:
                out[i, j] = u[i, j] + k * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - real(4.0) * u[i, j])
            else:
                out[i, j] = u[i, j]

    def rowsq(x: pnex.In(DT, (None, None)), w: pnex.In(DT, ("x.size(1)",)), r: pnex.Out(DT, ("x.size(0)",))):
        row = cuda.grid(1)
        if row < x.shape[0]:
            s = real(0.0)
            for k in range(x.shape[1]):
                s += w[k] * x[row, k] * x[row, k]
            r[row] = s

    def muladd(a: pnex.In(DT, (None,)), b: pnex.In(DT, "a"), c: pnex.Scalar("f32"), r: pnex.Out(DT, "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = a[i] * b[i] + c

    made = []
    for fn, n_threads, block in (
        (muladd, "a.numel()", threads),
        (elementwise, "x.numel()", threads),
        (stencil, ("u.size(1)", "u.size(0)"), (8, max(threads // 8, 1))),
        (rowsq, "x.size(0)", threads),
    ):
        fn.__name__ += suffix  # one op per dtype
        fn.__qualname__ = fn.__name__
        made.append(pnex.jit(n_threads=n_threads, threads_per_block=block, backward="auto")(fn))
    made.append(lltm(dtype) if dtype in (torch.float32, torch.float64) else None)
    _made[key] = Kernels(*made)
    return _made[key]


def lltm(dtype: torch.dtype) -> Any:
    """notebooks/03_lltm's forward kernel (benchmarks/workloads.py's, the same source), as a
    new op with its backward derived: the hand-written one stays attached to workloads'."""
    hand = workloads.lltm_ops(dtype).forward
    fn = hand.definition.fn
    derived = pnex.jit(n_threads=("old_cell.size(1)", "old_cell.size(0)"),
                       threads_per_block=workloads.LLTM_THREADS_PER_BLOCK, backward="auto")
    clone = type(fn)(fn.__code__, fn.__globals__, fn.__name__ + "_derived", fn.__defaults__, fn.__closure__)
    clone.__qualname__ = clone.__name__
    clone.__module__ = fn.__module__  # "workloads": the op's name hashes module.qualname
    clone.__annotations__ = dict(fn.__annotations__)
    return derived(clone)


# ------------------------------------------------------------------------ references in PyTorch
def elementwise_reference(x, w, c):
    v = x
    t = torch.where(v > 0, torch.exp(-v) * w + torch.sqrt(v.clamp(min=0)), torch.tanh(v) * w ** 2 - c)
    return t * torch.log1p(w * w), torch.maximum(v, w) + v.abs() / (1 + w * w)


def stencil_reference(u, k):
    out = u.clone()
    lap = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    inner = u[1:-1, 1:-1] + k * lap
    return torch.cat([out[:1], torch.cat([out[1:-1, :1], inner, out[1:-1, -1:]], 1), out[-1:]], 0)


def rowsq_reference(x, w):
    return (w * x * x).sum(1)


lltm_reference = workloads.lltm_cell_reference


def muladd_reference(a, b, c):
    return a * b + c


# ------------------------------------------------------------------------ hand-written backwards
class HandWritten(NamedTuple):
    muladd: Any  #: (grad_r, a, b) -> (grad_a, grad_b)
    elementwise: Any  #: (x, w, c, grad_y, grad_z) -> (grad_x, grad_w)
    lltm: Any  #: notebooks/03_lltm's: (grad_new_h, grad_new_cell, gates, new_cell) -> (grad_gates, grad_old_cell)


_hand: dict = {}


def hand_written(dtype: torch.dtype = torch.float32, threads: int = 256) -> HandWritten:
    """Backward kernels written by hand for :func:`kernels`' muladd and elementwise (not
    attached: the benchmark times them against the derived ones, the tests compare
    their results), and the LLTM's of :mod:`workloads`."""
    key = (dtype, threads)
    if key in _hand:
        return _hand[key]
    DT, real, suffix = _types(dtype)

    def muladd_backward(grad_r: pnex.In(DT, (None,)), a: pnex.In(DT, "grad_r"), b: pnex.In(DT, "grad_r"),
                        grad_a: pnex.Out(DT, "a"), grad_b: pnex.Out(DT, "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            g = grad_r[i]
            grad_a[i] = g * b[i]
            grad_b[i] = g * a[i]

    def elementwise_backward(x: pnex.In(DT, (None,)), w: pnex.In(DT, "x"), c: pnex.Scalar("f32"),
                             grad_y: pnex.In(DT, "x"), grad_z: pnex.In(DT, "x"),
                             grad_x: pnex.Out(DT, "x"), grad_w: pnex.Out(DT, "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            v = real(x[i])
            wi = real(w[i])
            gy = real(grad_y[i])
            gz = real(grad_z[i])
            one = real(1.0)
            w2 = wi * wi
            den = one + w2
            log_den = math.log1p(w2)
            if v > 0:
                e = math.exp(-v)
                root = math.sqrt(v)
                t = e * wi + root
                dt_dv = real(0.5) / root - e * wi
                dt_dw = e
            else:
                th = math.tanh(v)
                t = th * w2 - c
                dt_dv = (one - th * th) * w2
                dt_dw = real(2.0) * th * wi
            gx = gy * log_den * dt_dv
            gw = gy * (log_den * dt_dw + t * real(2.0) * wi / den)
            if v >= wi:
                gx += gz
            else:
                gw += gz
            if v > 0:
                gx += gz / den
            elif v < 0:
                gx -= gz / den
            gw -= gz * abs(v) * real(2.0) * wi / (den * den)
            grad_x[i] = gx
            grad_w[i] = gw

    made = []
    for fn, n_threads in ((muladd_backward, "a.numel()"), (elementwise_backward, "x.numel()")):
        fn.__name__ += suffix
        fn.__qualname__ = fn.__name__
        made.append(pnex.jit(n_threads=n_threads, threads_per_block=threads)(fn))
    made.append(workloads.lltm_ops(dtype).backward if dtype in (torch.float32, torch.float64) else None)
    _hand[key] = HandWritten(*made)
    return _hand[key]
