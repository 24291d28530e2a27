"""Derived backward kernels (issue 28, pnex_magic.adjoint) on CPU tensors: what the transform
does not differentiate exactly is refused, naming the line (InMut, shared memory, atomics,
barriers, while loops, breaks, reads of an output, ...) and a failed derivation leaves the
previous definition; scalars get no gradient and integer outputs none; floor division and
conversions; ``jit(backward=...)`` takes only "auto".
"""

from __future__ import annotations

import math

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError

from adjoint_helpers import rand

F64 = torch.float64


# ------------------------------------------------------------------------ what is refused
def k_inmut(x: pnex.InMut("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i]


def k_shared(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    tile = cuda.shared.array(32, numba_f64)
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] + tile[0]


def k_atomic(x: pnex.In("f64", (None,)), y: pnex.Out("f64", (1,), init=0)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(y, 0, x[i])


def k_sync(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    cuda.syncthreads()
    if i < x.shape[0]:
        y[i] = x[i]


def k_while(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        while v > 1.0:
            v = v / 2.0
        y[i] = v


def k_break(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        s = 0.0
        for k in range(10):
            if s > 3.0:
                break
            s += x[i]
        y[i] = s


@cuda.jit(device=True)
def square(v):
    return v * v


def k_device(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = square(x[i])


def k_reads_output(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i]
        y[i] = y[i] * 2.0


def k_overwrites(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i]
        y[i] = 2.0 * x[i]


def k_unsupported_math(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = math.sinh(x[i])


def k_int_only(x: pnex.In("f64", (None,)), y: pnex.Out("i32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = int(x[i])


def k_int_shape(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x"), idx: pnex.Out("i32", "x")):
    i = cuda.grid(1)
    if i < len(idx):
        y[i] = x[i]
        idx[i] = i


numba_f64 = __import__("numba").float64

REFUSED = [
    (k_inmut, r"writes 'x' in place \(InMut\)"),
    (k_shared, r"line \d+ \(`tile = cuda.shared.array\(32, numba_f64\)`\): shared memory"),
    (k_atomic, r"line \d+ .*atomics \(cuda.atomic.\*\)"),
    (k_sync, r"line \d+ .*cuda.syncthreads\(\)"),
    (k_while, r"line \d+ \(`while v > 1.0:`\): while loops are not supported"),
    (k_break, r"line \d+ \(`break`\): break is not supported"),
    (k_device, r"line \d+ .*device function square"),
    (k_reads_output, r"line \d+ .*reads the output 'y'"),
    (k_overwrites, r"'y' is written at lines \d+ and \d+ on one path"),
    (k_unsupported_math, r"math.sinh is not among the differentiable functions"),
    (k_int_only, r"no floating-point Out tensor; integer outputs are not differentiable"),
    (k_int_shape, r"no tensor shaped like the integer output 'idx'"),
]


@pytest.mark.parametrize("kernel,message", REFUSED, ids=[k.__name__ for k, _ in REFUSED])
def test_what_cannot_be_differentiated_exactly_is_refused(kernel, message):
    op = pnex.jit(n_threads="x.numel()", threads_per_block=32)(kernel)
    with pytest.raises(KernelDefinitionError, match=message) as info:
        pnex.derive_backward(op)
    assert "derive_backward(" in str(info.value)


def test_a_failed_derivation_leaves_the_previous_definition(monkeypatch):
    def k_twice(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = 2.0 * x[i]

    first = pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_twice)

    def k_twice(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):  # noqa: F811 - a re-definition
        i = cuda.grid(1)
        while i < x.shape[0]:
            y[i] = 3.0 * x[i]
            i += 1024

    with pytest.raises(KernelDefinitionError, match="while loops"):
        pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_twice)
    x = rand(5)
    first(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0, dtype=F64))


def test_scalars_get_no_gradient_and_integer_outputs_none():
    def k_mixed(x: pnex.In("f64", (None,)), c: pnex.Scalar("f64"), y: pnex.Out("f64", "x"),
                sign: pnex.Out("i32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = c * x[i] * x[i]
            sign[i] = 1 if x[i] > 0 else -1

    op = pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_mixed)
    bwd = pnex.autograd.attached_backward(op).backward
    assert [p.name for p in bwd.spec.outputs] == ["grad_x"]
    assert [p.name for p in bwd.spec.arguments] == ["x", "c", "grad_y"]
    x = rand(6)
    y, sign = op(x, 1.5)
    assert not sign.requires_grad
    y.sum().backward()
    torch.testing.assert_close(x.grad, 3.0 * x.detach())


def test_floor_division_and_conversions():
    def k_floor(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = (x[i] // 0.5) * float(x[i]) + int(x[i] * 4.0)

    op = pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_floor)
    x = rand(8)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.div(x.detach(), 0.5, rounding_mode="floor"))


def test_jit_backward_takes_only_auto():
    with pytest.raises(KernelDefinitionError, match="the only value is 'auto'"):
        pnex.jit(n_threads="x.numel()", backward="yes")
