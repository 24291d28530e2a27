"""End-to-end tests of the compiler core on CPU tensors (numba-cuda's CUDA simulator).

Every kernel here is compiled to PTX at definition (no GPU needed) and run by the
simulator; results are compared with plain PyTorch on the same random inputs.
Sizes are small: the simulator runs one Python thread per CUDA thread.
"""

import subprocess
import sys

import numba
import pytest
import torch
import torch.nn.functional as F
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, KernelLaunchError

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


def muladd_ref(a, b, c):
    return (a.double() * b.double() + c).float()


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
# Shared memory and barriers: a 5-point Laplacian with a one-cell halo.
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

NBINS = 16


@pnex.jit(n_threads="x.numel()")
def histogram(x: pnex.In("i64", (None,)), hist: pnex.Out("i32", (NBINS,), init=0)):
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.add(hist, x[i], 1)


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


def test_several_outputs_in_declaration_order():
    a, b = rand(300, dtype=torch.float64, seed=13), rand(300, dtype=torch.float64, seed=14)
    result = stats3(a, b)
    assert isinstance(result, tuple) and len(result) == 3
    total, bigger, n_bigger = result
    assert (total.dtype, bigger.dtype, n_bigger.dtype) == (torch.float64, torch.int32, torch.int64)
    assert torch.equal(total, a + b)
    assert torch.equal(bigger, (a > b).int())
    assert n_bigger.tolist() == [int((a > b).sum())]


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


@pnex.jit(n_threads=("out.size(2)", "out.size(1)", "out.size(0)"), threads_per_block=(4, 4, 2))
def add_position(a: pnex.In("f32", (None, None, None)), out: pnex.Out("f32", "a")):
    x, y, z = cuda.grid(3)
    if z < out.shape[0] and y < out.shape[1] and x < out.shape[2]:
        out[z, y, x] = a[z, y, x] + 100 * z + 10 * y + x


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


@pnex.jit(n_threads="out.numel()", threads_per_block=32)
def iota(n: int, start: int, out: pnex.Out("i64", ("n * 2",), init=-1)):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = start + i


def test_n_threads_over_outputs_and_scalar_shape():
    out = iota(37, 5)
    assert out.shape == (74,)
    assert torch.equal(out, torch.arange(5, 5 + 74))  # the init -1 was overwritten everywhere
    assert iota(0, 1).shape == (0,)


# --------------------------------------------------------------------------------------
# Non-contiguous inputs.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=(8, 8))
def copy_2d(a: pnex.In("f32", (None, None)), out: pnex.Out("f32", "a", init=SENTINEL)):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x]


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


# --------------------------------------------------------------------------------------
# torch.compile and opcheck.
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def f(a, b, x):
        r = mymuladd_grid(a, b, 0.5) * 2
        h = histogram(x)
        y = torch.zeros_like(a).flatten()
        fill_double(a.flatten().double(), y.double())  # a mutation on a temporary: traced, harmless
        return r + 1, h.sum()

    compiled = torch.compile(f, fullgraph=True)
    for shape in [(4, 6), (5, 3)]:
        a, b = rand(*shape, seed=23), rand(*shape, seed=24)
        x = torch.randint(0, NBINS, (20,), generator=torch.Generator().manual_seed(25))
        r, hsum = compiled(a, b, x)
        torch.testing.assert_close(r, muladd_ref(a, b, 0.5) * 2 + 1)
        assert hsum.item() == 20


@pytest.mark.slow
def test_torch_compile_fullgraph_inmut():
    torch._dynamo.reset()

    def g(a, y):
        fill_double(a, y)
        return y + 1

    compiled = torch.compile(g, fullgraph=True)
    a = rand(9, dtype=torch.float64, seed=26)
    y = torch.full((9,), float("nan"), dtype=torch.float64)
    out = compiled(a, y)
    assert torch.equal(y, 2 * a)  # the mutation is visible to the caller
    assert torch.equal(out, 2 * a + 1)


def _opcheck(op, args):
    torch.library.opcheck(op, args)


OPCHECK_CASES = {
    "copy": lambda: (copy, (rand(5),)),
    "scalar-float": lambda: (mymuladd_2d, (rand(3, 3), rand(3, 3, seed=1), 0.5)),
    "grid-2d": lambda: (mymuladd_grid, (rand(3, 4), rand(3, 4, seed=1), 0.5)),
    "shared-memory": lambda: (laplacian, (rand(5, 6, dtype=torch.float64),)),
    "init-atomics": lambda: (histogram, (torch.tensor([1, 3, 3, 15]),)),
    "several-outputs": lambda: (stats3, (rand(6, dtype=torch.float64), rand(6, dtype=torch.float64, seed=1))),
    "inmut-no-outputs": lambda: (fill_double, (rand(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64))),
    "inmut-and-output": lambda: (scale_and_sum, (rand(5, dtype=torch.float64), 2.0)),
    "unused": lambda: (double_maybe_index, (rand(5),)),
    "grid-3d": lambda: (add_position, (rand(2, 3, 4),)),
    "int-scalar-shape": lambda: (iota, (3, 2)),
    "device-function": lambda: (cube_plus_one, (rand(4),)),
    "non-contiguous-input": lambda: (copy_2d, (rand(4, 6)[:, ::2],)),
}


@pytest.mark.parametrize("case", list(OPCHECK_CASES))
def test_opcheck(case):
    op, args = OPCHECK_CASES[case]()
    _opcheck(op, args)


# --------------------------------------------------------------------------------------
# Redefinition, to_extension, the op object.
# --------------------------------------------------------------------------------------


_SCALER_FACTOR = 1.0


def make_scaler(factor: float):
    """One definition re-run after its global constant changed (a notebook cell re-run
    after editing a constant): one site, one op name, the new kernel replaces the old.
    (A closure value instead makes one op per value: see
    test_a_kernel_factory_makes_one_op_per_closure_value_and_a_rerun_replaces.)"""
    global _SCALER_FACTOR
    _SCALER_FACTOR = factor

    @pnex.jit(n_threads="a.numel()")
    def scaler(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * _SCALER_FACTOR

    return scaler


def test_redefinition_replaces_the_op():
    a = rand(8, seed=27)
    first = make_scaler(2.0)
    assert torch.equal(first(a), a * 2.0)
    second = make_scaler(3.0)
    assert second._qualname == first._qualname
    assert second.definition.op_name == first.definition.op_name
    assert torch.equal(second(a), a * 3.0)
    registered = getattr(torch.ops.pnex, second.definition.op_name)
    assert torch.equal(registered(a), a * 3.0)
    assert torch.equal(registered.default(a), a * 3.0)


STALE_OP_SCRIPT = """
import torch
from numba import cuda
import pnex_magic as pnex

FACTOR = 0.0

def make(factor):  # a re-run with another global constant: one op name, replaced
    global FACTOR
    FACTOR = factor

    @pnex.jit(n_threads="a.numel()")
    def rescaler(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * FACTOR
    return rescaler

a = torch.ones(3)
ops = [make(float(k)) for k in range(1, 5)]
for op in ops:
    for _ in range(3):
        print("RESULT", op(a).tolist())
"""


# Re-registering a name destroys the old torch.library registration (CustomOpDef uses
# get_library_allowing_overwrite); make_op points every earlier op object of the name at
# the new one, so an old object never calls into freed memory.


def test_replaced_op_object_uses_the_live_registration():
    first = make_scaler(5.0)
    second = make_scaler(6.0)
    assert first._opoverload is second._opoverload


# Not strict: a use-after-free fails only now and then.
@pytest.mark.slow
def test_calling_a_replaced_op_object(tmp_path, pnex_env):
    """A notebook keeps old op objects around (a model holding one, say) after the
    cell is re-run: calling one must not crash.  It runs the latest definition.
    In a subprocess, since the failure mode is a crash."""
    script = tmp_path / "stale_ops.py"
    script.write_text(STALE_OP_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], env=pnex_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-2000:]}"
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert results == ["RESULT [4.0, 4.0, 4.0]"] * 12


def _make_kernel_named_twin(signature: str):
    """Two definitions of one kernel name in one module: same op name."""
    if signature == "one":
        @pnex.jit(n_threads="a.numel()")
        def twin(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] + 1.0
    else:
        @pnex.jit(n_threads="a.numel()")
        def twin(a: pnex.In("f32", (None,)), s: float, out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * s
    return twin


def test_redefinition_with_another_signature_makes_old_objects_fail_clearly():
    a = rand(6, seed=31)
    old = _make_kernel_named_twin("one")
    assert torch.equal(old(a), a + 1.0)
    new = _make_kernel_named_twin("two")
    assert old._qualname == new._qualname
    assert torch.equal(new(a, 3.0), a * 3.0)
    with pytest.raises(KernelDefinitionError, match=r"(?s)twin\(\): this op object is from an earlier definition, "
                       r"twin\(a: Tensor\[float32, \(None,\)\]\).*redefined at .*test_core.py:\d+ as "
                       r"twin\(a: Tensor\[float32, \(None,\)\], s: float\).*Use the object the new definition"):
        old(a)
    # Re-running the first definition brings the old signature back: the newest object works,
    # and so does `new`'s signature no longer (it is superseded in turn).
    again = _make_kernel_named_twin("one")
    assert torch.equal(again(a), a + 1.0)
    with pytest.raises(KernelDefinitionError, match="redefined"):
        new(a, 3.0)


def test_failed_redefinition_leaves_the_previous_op_registered():
    from pnex_magic.define import definition as make_definition
    from pnex_magic.define import registered

    a = rand(5, seed=32)
    first = make_scaler(2.0)
    retry = make_definition(first.definition.fn, n_threads="a.numel()")  # scale 2 again, later
    four = make_scaler(4.0)
    assert torch.equal(first(a), a * 4.0)  # same signature: earlier objects call the newest kernel
    with pytest.raises(RuntimeError, match="fails inside"):
        with registered(retry) as op:
            assert torch.equal(op(a), a * 2.0) and torch.equal(first(a), a * 2.0)
            raise RuntimeError("fails inside the transaction")
    # The definition registered before the failed block (scale 4) is back, everywhere.
    assert first.definition is four.definition and op.definition is four.definition
    for call in (first, four, op, getattr(torch.ops.pnex, four.definition.op_name)):
        assert torch.equal(call(a), a * 4.0)


def test_op_names_are_deterministic_and_distinct():
    assert copy._qualname == f"pnex::{copy.definition.op_name}"
    assert copy.definition.op_name.startswith("copy_")
    assert mymuladd_2d.definition.op_name != mymuladd_2d_marked.definition.op_name
    assert isinstance(copy, torch.library.CustomOpDef)
    assert isinstance(copy, pnex.PnexOp)
    text = repr(mymuladd_grid)
    assert "mymuladd_grid(a: Tensor[float32, (None, None)]" in text and "c: float" in text


def test_to_extension_op_runs_on_cpu():
    assert mymuladd_grid.definition.options.to_extension is True
    a, b = rand(3, 3), rand(3, 3, seed=1)
    torch.testing.assert_close(mymuladd_grid(a, b, 1.0), muladd_ref(a, b, 1.0))


def test_device_function_call():
    a = rand(50, seed=28)
    torch.testing.assert_close(cube_plus_one(a), a.double().pow(3).add(1).float())


@cuda.jit(device=True)
def _cube(v):
    return v * v * v


@pnex.jit(n_threads="a.numel()")
def cube_plus_one(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = _cube(a[i]) + 1


def test_a_kernel_factory_makes_one_op_per_closure_value_and_a_rerun_replaces():
    """``make(2.0)`` and ``make(3.0)`` define the same function at the same place: with
    op names from the site alone, the second silently replaced the first (both ops then
    ran the last kernel).  The closure's values are part of the site."""
    def make(factor):
        @pnex.jit(n_threads="a.numel()")
        def scale(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                r[i] = a[i] * factor

        return scale

    a = torch.randn(40)
    two, three = make(2.0), make(3.0)
    assert two._pnex.op_name != three._pnex.op_name
    torch.testing.assert_close(two(a), a * 2)
    torch.testing.assert_close(three(a), a * 3)
    again = make(2.0)  # a re-run with the same values replaces its op
    assert again._pnex.op_name == two._pnex.op_name
    torch.testing.assert_close(again(a), a * 2)
