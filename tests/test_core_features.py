"""End-to-end tests of the compiler core on CPU tensors (numba-cuda's CUDA simulator): shared
memory and barriers, atomics, several outputs and InMut, unused parameters, a 3-D grid, shapes
from scalars.

Every kernel here is compiled to PTX at definition (no GPU needed) and run by the
simulator; results are compared with plain PyTorch on the same random inputs.
Sizes are small: the simulator runs each CUDA thread as Python code.
"""

import torch
import torch.nn.functional as F
from numba import cuda

import pnex_magic as pnex

from core_kernels import (
    HALO_TILE,
    NBINS,
    SENTINEL,
    add_position,
    double_maybe_index,
    fill_double,
    histogram,
    iota,
    laplacian,
    rand,
    scale_and_sum,
    stats3,
)


# --------------------------------------------------------------------------------------
# Shared memory and barriers: a 5-point Laplacian with a one-cell halo.
# --------------------------------------------------------------------------------------


def laplacian_ref(u):
    k = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    return F.conv2d(u[None, None], k[None, None], padding=1)[0, 0]


def test_shared_memory_stencil():
    u = rand(12, 19, dtype=torch.float64, seed=11)  # partial tiles on both axes
    out = laplacian(u)
    torch.testing.assert_close(out, laplacian_ref(u), rtol=1e-12, atol=1e-12)
    # the interior, by slicing, too
    inner = u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * u[1:-1, 1:-1]
    torch.testing.assert_close(out[1:-1, 1:-1], inner, rtol=1e-12, atol=1e-12)
    assert pnex.inspect(laplacian).shared_bytes == HALO_TILE * HALO_TILE * 8


# --------------------------------------------------------------------------------------
# Atomics into a zero-initialised output.
# --------------------------------------------------------------------------------------


def test_histogram_atomic_add():
    g = torch.Generator().manual_seed(12)
    x = torch.randint(0, NBINS, (700,), generator=g)
    x[:50] = 3  # a contended bin
    hist = histogram(x)
    assert hist.dtype == torch.int32 and hist.shape == (NBINS,)
    assert torch.equal(hist, torch.bincount(x, minlength=NBINS).int())
    # init=0 is applied on every call, not once
    assert torch.equal(histogram(x[:10]), torch.bincount(x[:10], minlength=NBINS).int())


# --------------------------------------------------------------------------------------
# Several outputs, InMut, no outputs.
# --------------------------------------------------------------------------------------


def test_several_outputs_in_declaration_order():
    a, b = rand(300, dtype=torch.float64, seed=13), rand(300, dtype=torch.float64, seed=14)
    result = stats3(a, b)
    assert isinstance(result, tuple) and len(result) == 3
    total, bigger, n_bigger = result
    assert (total.dtype, bigger.dtype, n_bigger.dtype) == (torch.float64, torch.int32, torch.int64)
    assert torch.equal(total, a + b)
    assert torch.equal(bigger, (a > b).int())
    assert n_bigger.tolist() == [int((a > b).sum())]


def test_inmut_without_outputs_returns_none():
    a = rand(300, dtype=torch.float64, seed=15)
    y = torch.full((300,), float("nan"), dtype=torch.float64)
    ptr = y.data_ptr()
    assert fill_double(a, y) is None
    assert y.data_ptr() == ptr
    assert not y.isnan().any(), "some elements of the InMut tensor were not written"
    assert torch.equal(y, 2.0 * a)


def test_inmut_schema_marks_mutation():
    registered = getattr(torch.ops.pnex, fill_double.definition.op_name).default
    assert "Tensor(y!) y" in str(registered._schema)
    assert fill_double.spec.schema == "(Tensor a, Tensor(y!) y) -> ()"
    assert scale_and_sum.spec.schema == "(Tensor(x!) x, float s) -> Tensor"
    assert scale_and_sum.spec.mutated == ("x",)


def test_inmut_and_output():
    x = rand(40, dtype=torch.float64, seed=16)
    expected = x * 3.0
    total = scale_and_sum(x, 3.0)
    assert torch.equal(x, expected)
    torch.testing.assert_close(total, expected.sum().reshape(1))


def test_inmut_non_contiguous_view_writes_through():
    base = torch.full((6, 8), SENTINEL, dtype=torch.float64)
    view = base[1:5, ::2]  # 4 x 4, strided
    a = rand(4, 4, dtype=torch.float64, seed=17)
    assert fill_double_2d(a, view) is None
    assert torch.equal(base[1:5, ::2], 2.0 * a)
    untouched = torch.ones_like(base, dtype=torch.bool)
    untouched[1:5, ::2] = False
    assert (base[untouched] == SENTINEL).all()


@pnex.jit(n_threads=("y.size(1)", "y.size(0)"), threads_per_block=(4, 4))
def fill_double_2d(a: pnex.In("f64", (None, None)), y: pnex.InMut("f64", "a")):
    x, r = cuda.grid(2)
    if r < y.shape[0] and x < y.shape[1]:
        y[r, x] = 2.0 * a[r, x]


# --------------------------------------------------------------------------------------
# Unused parameters.
# --------------------------------------------------------------------------------------


def make_double_maybe_index(with_index: bool):
    @pnex.jit(n_threads="a.numel()")
    def double_maybe_index_closure(
        a: pnex.In("f32", (None,)),
        out: pnex.Out("f32", "a"),
        idx: pnex.Out("i64", "a") if with_index else pnex.Unused,
    ):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * 2
            if with_index:
                idx[i] = i

    return double_maybe_index_closure


def test_unused_parameter_is_dropped():
    spec = double_maybe_index.spec
    assert [p.role for p in spec.params] == ["in", "out", "unused"]
    assert spec.schema == "(Tensor a) -> Tensor"
    a = rand(10)
    out = double_maybe_index(a)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, a * 2)


def test_unused_parameter_from_closure_flag():
    a = rand(10)
    without = make_double_maybe_index(False)
    assert torch.equal(without(a), a * 2)
    with_idx = make_double_maybe_index(True)
    assert with_idx.spec.schema == "(Tensor a) -> (Tensor, Tensor)"
    out, idx = with_idx(a)
    assert torch.equal(out, a * 2)
    assert torch.equal(idx, torch.arange(10))


# --------------------------------------------------------------------------------------
# A 3-D launch grid.
# --------------------------------------------------------------------------------------


def test_3d_grid():
    a = rand(3, 5, 6, seed=18)
    z = torch.arange(3).view(3, 1, 1)
    y = torch.arange(5).view(1, 5, 1)
    x = torch.arange(6).view(1, 1, 6)
    expected = a + (100 * z + 10 * y + x).float()
    torch.testing.assert_close(add_position(a), expected)
    assert add_position.spec.threads_per_block == (4, 4, 2)


# --------------------------------------------------------------------------------------
# n_threads over an output whose size comes from a scalar.
# --------------------------------------------------------------------------------------


def test_n_threads_over_outputs_and_scalar_shape():
    out = iota(37, 5)
    assert out.shape == (74,)
    assert torch.equal(out, torch.arange(5, 5 + 74))  # the init -1 was overwritten everywhere
    assert iota(0, 1).shape == (0,)
