"""End-to-end tests of the compiler core on CPU tensors (numba-cuda's CUDA simulator): the API
document's examples (tests/core_kernels.py), what their indexing writes, and non-contiguous inputs.

Every kernel here is compiled to PTX at definition (no GPU needed) and run by the
simulator; results are compared with plain PyTorch on the same random inputs.
Sizes are small: the simulator runs each CUDA thread as Python code.
"""

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelLaunchError

from core_kernels import (
    SENTINEL,
    copy,
    copy_2d,
    muladd_ref,
    mymuladd_2d,
    mymuladd_2d_marked,
    mymuladd_grid,
    rand,
)


# The row-major indexing the document meant: divide by the number of columns.
@pnex.jit(n_threads="result.numel()")
def mymuladd_flat(
    a: pnex.In(torch.float32, (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: pnex.Out("float32", "a", init=SENTINEL),
):
    idx = cuda.grid(1)
    y, x = divmod(idx, result.shape[1])
    if y < result.shape[0]:
        result[y, x] = a[y, x] * b[y, x] + c


def test_copy_example():
    a = torch.arange(5, dtype=torch.float32)
    assert torch.equal(copy(a), torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]))
    a = rand(300)  # more than one block of 256
    out = copy(a)
    assert out.dtype == torch.float32 and out.shape == a.shape
    assert torch.equal(out, a)
    assert out.data_ptr() != a.data_ptr()


def test_copy_empty_input_launches_nothing():
    out = copy(torch.empty(0))
    assert out.shape == (0,)


def test_mymuladd_2d_square():
    a, b = rand(7, 7, seed=1), rand(7, 7, seed=2)
    torch.testing.assert_close(mymuladd_2d(a, b, 0.5), muladd_ref(a, b, 0.5))
    # every element written: same body, sentinel-initialised output
    torch.testing.assert_close(mymuladd_2d_marked(a, b, -1.25), muladd_ref(a, b, -1.25))


def test_mymuladd_2d_wide_leaves_columns_unwritten():
    # divmod(idx, rows) walks a rows x rows square: on a wide input (rows < columns)
    # columns >= rows are never written (they keep the sentinel; plain
    # mymuladd_2d would return uninitialised memory there).
    a, b = rand(3, 5, seed=3), rand(3, 5, seed=4)
    out = mymuladd_2d_marked(a, b, 0.5)
    torch.testing.assert_close(out[:, :3], muladd_ref(a, b, 0.5)[:, :3])
    assert (out[:, 3:] == SENTINEL).all()


def test_mymuladd_2d_tall_indexes_out_of_bounds():
    # On a tall input x = idx % rows reaches past the last column: an
    # out-of-bounds access, reported by the simulator.
    a, b = rand(5, 3, seed=5), rand(5, 3, seed=6)
    with pytest.raises(KernelLaunchError, match="mymuladd_2d.*simulator"):
        mymuladd_2d(a, b, 0.5)


def test_muladd_row_major_indexing_non_square():
    for shape in [(3, 5), (5, 3), (1, 9)]:
        a, b = rand(*shape, seed=7), rand(*shape, seed=8)
        torch.testing.assert_close(mymuladd_flat(a, b, 2.0), muladd_ref(a, b, 2.0))


def test_mymuladd_grid():
    for shape in [(7, 7), (5, 20), (19, 3)]:  # several (16, 16) blocks on some axes
        a, b = rand(*shape, seed=9), rand(*shape, seed=10)
        torch.testing.assert_close(mymuladd_grid(a, b, 0.5), muladd_ref(a, b, 0.5))


def test_scalar_argument_accepts_int_for_float():
    a, b = rand(4, 4), rand(4, 4, seed=1)
    torch.testing.assert_close(mymuladd_grid(a, b, 2), muladd_ref(a, b, 2.0))


def test_keyword_arguments():
    a, b = rand(4, 6), rand(4, 6, seed=1)
    expected = muladd_ref(a, b, 1.5)
    torch.testing.assert_close(mymuladd_grid(a, b=b, c=1.5), expected)
    torch.testing.assert_close(mymuladd_grid(c=1.5, b=b, a=a), expected)


# --------------------------------------------------------------------------------------
# Non-contiguous inputs.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda t: t.t(), id="transposed"),
        pytest.param(lambda t: t[::2, 1::3], id="sliced-with-step"),
        pytest.param(lambda t: t[2, :5].expand(6, 5), id="expanded-rows"),
        pytest.param(lambda t: t[:6, :1].expand(6, 4), id="expanded-columns"),
        pytest.param(lambda t: t[3:9, 2:7], id="offset-view"),
    ],
)
def test_non_contiguous_inputs(make):
    base = rand(10, 12, seed=19)
    view = make(base)
    assert not view.is_contiguous() or view.storage_offset() > 0
    out = copy_2d(view)
    assert out.is_contiguous()
    assert torch.equal(out, view)


def test_non_contiguous_1d_inputs():
    base = rand(40, seed=20)
    assert torch.equal(copy(base[::3]), base[::3])
    assert torch.equal(copy(base[5:30:7]), base[5:30:7])
    assert torch.equal(copy(base[7].expand(9)), base[7].expand(9))


def test_non_contiguous_muladd():
    a, b = rand(6, 9, seed=21), rand(9, 6, seed=22)
    torch.testing.assert_close(mymuladd_grid(a, b.t(), 0.5), muladd_ref(a, b.t(), 0.5))
