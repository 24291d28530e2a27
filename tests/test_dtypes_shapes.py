"""Every supported dtype, every way to spell one, scalar annotations and shape forms."""

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.dtypes import DType, resolve_dtype, supported_dtype_names

ALL_DTYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
]


def test_supported_dtypes_are_all_tested():
    assert sorted(supported_dtype_names()) == sorted(ALL_DTYPES)


# --------------------------------------------------------------------------------------
# Kernels over every dtype.
# --------------------------------------------------------------------------------------


def make_copy(dt):
    @pnex.jit(n_threads="a.numel()", threads_per_block=64)
    def copy_any(a: pnex.In(dt, (None,)), out: pnex.Out(dt, "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    return copy_any


def make_add(dt):
    @pnex.jit(n_threads="a.numel()", threads_per_block=64)
    def add_any(a: pnex.In(dt, (None,)), b: pnex.In(dt, "a"), c: pnex.Scalar(dt), out: pnex.Out(dt, "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + b[i] + c

    return add_any


def random_values(dt: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if dt == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dt.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dt)
    info = torch.iinfo(dt)
    lo, hi = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dt)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_copy_every_dtype(name):
    dt = getattr(torch, name)
    op = make_copy(name)
    a = random_values(dt, 100)
    out = op(a)
    assert out.dtype == dt and out.shape == (100,)
    assert torch.equal(out.view(torch.uint8), a.view(torch.uint8)) if name != "bool" else torch.equal(out, a)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_add_every_dtype(name):
    dt = getattr(torch, name)
    op = make_add(name)
    n = 70
    i = torch.arange(n)
    if name == "bool":
        a, b, c = (i % 2 == 0), (i % 3 == 0), False
        expected = a | b
        assert torch.equal(op(a, b, c), expected)
        assert op(a, b, True).all()
        return
    signed = not name.startswith("uint")
    a = (i % 7 - (3 if signed else 0)).to(dt)
    b = (i % 5).to(dt)
    c = 2.5 if dt.is_floating_point else 2
    expected = (a.double() + b.double() + c).to(dt)
    out = op(a, b, c)
    assert out.dtype == dt
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_precision_arithmetic_links_for_both_layouts(name):
    """Numba-CUDA's float16/bfloat16 operators are external CUDA C++ functions: the
    cubin links them in, for the contiguous and the strided kernel variant."""
    definition = make_add(name).definition
    for layout in ("C", "A"):
        compiled = definition.compiled(layout=layout)
        assert ".extern .func" in compiled.ptx
        assert compiled.cubin and compiled.resources is not None and compiled.resources.registers > 0


def test_signature_uses_dtype_names():
    op = make_add("bfloat16")
    assert "a: Tensor[bfloat16, (None,)]" in op.spec.python_signature()
    assert op.spec.schema == "(Tensor a, Tensor b, float c) -> Tensor"
    assert make_add("uint8").spec.schema == "(Tensor a, Tensor b, int c) -> Tensor"
    assert make_add("bool").spec.schema == "(Tensor a, Tensor b, bool c) -> Tensor"


def test_bfloat16_inmut_rounds_back():
    @pnex.jit(n_threads="x.numel()")
    def halve(x: pnex.InMut("bf16", (None,))):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] = x[i] * 0.5

    x = torch.tensor([3.0, 1.0, -7.5, 1000.0], dtype=torch.bfloat16)
    halve(x)
    assert torch.equal(x, torch.tensor([1.5, 0.5, -3.75, 500.0], dtype=torch.bfloat16))


# --------------------------------------------------------------------------------------
# Spellings.
# --------------------------------------------------------------------------------------

SPELLINGS = [
    (torch.float32, "float32"),
    (float, "float32"),
    ("float32", "float32"),
    ("f32", "float32"),
    ("float", "float32"),
    (np.float32, "float32"),
    (np.dtype("float32"), "float32"),
    ("torch.float32", "float32"),
    ("np.float32", "float32"),
    ("  Float32 ", "float32"),
    ("torch::kFloat32", "float32"),
    ("torch::kFloat", "float32"),
    ("double", "float64"),
    ("f64", "float64"),
    (np.float64, "float64"),
    ("half", "float16"),
    ("f16", "float16"),
    ("__half", "float16"),
    (torch.bfloat16, "bfloat16"),
    ("bf16", "bfloat16"),
    ("__nv_bfloat16", "bfloat16"),
    (int, "int64"),
    ("int", "int64"),
    ("long", "int64"),
    ("i64", "int64"),
    ("int64_t", "int64"),
    ("int32_t", "int32"),
    ("int32", "int32"),
    (np.int32, "int32"),
    (np.dtype("int32"), "int32"),
    ("torch::kInt", "int32"),
    ("i8", "int8"),
    ("int16_t", "int16"),
    ("uint8_t", "uint8"),
    ("u8", "uint8"),
    ("torch::kByte", "uint8"),
    (np.uint16, "uint16"),
    ("uint32_t", "uint32"),
    ("u64", "uint64"),
    (torch.uint64, "uint64"),
    (bool, "bool"),
    ("bool", "bool"),
    (np.bool_, "bool"),
    (torch.bool, "bool"),
]


@pytest.mark.parametrize("spelling, name", SPELLINGS, ids=[repr(s) for s, _ in SPELLINGS])
def test_dtype_spellings(spelling, name):
    dtype = resolve_dtype(spelling)
    assert isinstance(dtype, DType)
    assert dtype.name == name
    assert dtype.torch == getattr(torch, name)
    assert resolve_dtype(dtype) is dtype


def test_numba_type_spellings():
    from numba.cuda import types as nbtypes

    assert resolve_dtype(nbtypes.float32).name == "float32"
    assert resolve_dtype(nbtypes.int16).name == "int16"
    assert resolve_dtype(nbtypes.boolean).name == "bool"


@pytest.mark.parametrize(
    "spelling",
    ["f33", "complex64", torch.complex64, np.complex128, "", "float32x", None, object(), [], {}, 3, 2.5],
    ids=repr,
)
def test_unknown_spellings(spelling):
    assert resolve_dtype(spelling) is None


def test_dtype_properties():
    f16 = resolve_dtype("f16")
    assert (f16.itemsize, f16.is_floating_point, f16.schema_scalar, f16.python_type) == (2, True, "float", float)
    u64 = resolve_dtype("u64")
    assert (u64.itemsize, u64.is_floating_point, u64.schema_scalar, u64.python_type) == (8, False, "int", int)
    b = resolve_dtype(bool)
    assert (b.itemsize, b.schema_scalar, b.python_type, str(b)) == (1, "bool", bool, "bool")
    assert resolve_dtype("bf16").numpy is None


@pnex.jit(n_threads="a.numel()")
def spelled(
    a: pnex.In(torch.float32, (None,)),
    b: pnex.In(float, "a"),
    c: pnex.In("float32", "a"),
    d: pnex.In("f32", "a"),
    e: pnex.In(np.float32, "a"),
    f: pnex.In(np.dtype("float32"), "a"),
    g: pnex.In("int32_t", "a"),
    h: pnex.In(np.dtype("int32"), "a"),
    out: pnex.Out("double", "a"),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] + b[i] + c[i] + d[i] + e[i] + f[i] + g[i] + h[i]


def test_spellings_in_a_kernel():
    assert [p.dtype.name for p in spelled.spec.params] == ["float32"] * 6 + ["int32", "int32", "float64"]
    n = 10
    fs = [torch.arange(n, dtype=torch.float32) * k for k in range(1, 7)]
    ints = [torch.arange(n, dtype=torch.int32) * 10, torch.arange(n, dtype=torch.int32) * 100]
    out = spelled(*fs, *ints)
    expected = sum(t.double() for t in fs) + sum(t.double() for t in ints)
    assert out.dtype == torch.float64
    assert torch.equal(out, expected)


# --------------------------------------------------------------------------------------
# Scalar annotations.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="a.numel()")
def scalars(
    a: pnex.In("f64", (None,)),
    c: float,
    k: int,
    d: pnex.Scalar("f64"),
    flag: bool,
    s: "f32",  # noqa: F821 -- a dtype string is the Scalar shorthand too
    u: np.uint8,
    out: pnex.Out("f64", "a"),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        v = a[i] * c + k + d + s + u
        if flag:
            v = -v
        out[i] = v


def test_scalar_annotations():
    spec = scalars.spec
    kinds = {p.name: (p.role, p.dtype.name) for p in spec.params}
    assert kinds == {
        "a": ("in", "float64"),
        "c": ("scalar", "float32"),
        "k": ("scalar", "int64"),
        "d": ("scalar", "float64"),
        "flag": ("scalar", "bool"),
        "s": ("scalar", "float32"),
        "u": ("scalar", "uint8"),
        "out": ("out", "float64"),
    }
    assert spec.schema == "(Tensor a, float c, int k, float d, bool flag, float s, int u) -> Tensor"
    assert "c: float, k: int, d: float, flag: bool" in spec.python_signature()


def test_scalar_values():
    a = torch.arange(8, dtype=torch.float64)
    # c is float32: 0.1 arrives rounded to float32; d is float64: exact
    c32 = float(np.float32(0.1))
    expected = a * c32 + 3 + 0.125 + 0.5 + 200
    torch.testing.assert_close(scalars(a, 0.1, 3, 0.125, False, 0.5, 200), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scalars(a, 0.1, 3, 0.125, True, 0.5, 200), -expected, rtol=1e-12, atol=1e-12)
    big = 2**40 + 1  # int is int64
    assert scalars(a[:1], 0.0, big, 0.0, False, 0.0, 0).item() == float(big)


def test_scalar_subscript_forms():
    assert isinstance(pnex.Scalar["f64"], pnex.Scalar)
    ann = pnex.In["f32", (None,)]
    assert isinstance(ann, pnex.In) and ann.dtype == "f32" and ann.shape == (None,)
    assert repr(pnex.Out("f32", "a", init=0)) == "Out('f32', 'a', init=0)"
    assert repr(pnex.Unused()) == "Unused"


# --------------------------------------------------------------------------------------
# Shape forms.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads=("out.size(1)", "out.size(0)"), threads_per_block=(8, 8))
def shaped(
    a: pnex.In("f32", (2, None)),
    b: pnex.In("f32", 3),
    c: pnex.In("f32", ("a.size(1)", "b.size(0)")),
    out: pnex.Out("f32", ("c", 3), init=0),
):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[0, y] * b[x] + a[1, y] + c[y, x]


def test_shape_forms():
    spec = shaped.spec
    assert [p.shape_text() for p in spec.params] == [
        "(2, None)",
        "(3,)",
        "(a.size(1), b.size(0))",
        "(c.size(0), 3)",
    ]
    a = torch.arange(10, dtype=torch.float32).view(2, 5)
    b = torch.tensor([1.0, 2.0, 3.0])
    c = torch.ones(5, 3)
    out = shaped(a, b, c)
    assert out.shape == (5, 3)
    assert torch.equal(out, a[0][:, None] * b[None, :] + a[1][:, None] + c)


def test_zero_dimensional_tensors():
    @pnex.jit(n_threads="1")
    def scalar_tensor(a: pnex.In("f32", ()), out: pnex.Out("f32", ())):
        if cuda.grid(1) == 0:
            out[()] = a[()] * 2

    out = scalar_tensor(torch.tensor(3.5))
    assert out.shape == () and out.item() == 7.0
    assert scalar_tensor.spec.schema == "(Tensor a) -> Tensor"


@pytest.mark.parametrize("name", ["bfloat16", "float16", "bool", "uint16"])
def test_opcheck_unusual_dtypes(name):
    op = make_add(name)
    dt = getattr(torch, name)
    a = (torch.arange(4) % 2).to(dt)
    c = True if name == "bool" else (1.5 if dt.is_floating_point else 1)
    torch.library.opcheck(op, (a, a, c))


def test_opcheck_zero_dimensional():
    @pnex.jit(n_threads="1")
    def scalar_tensor_op(a: pnex.In("f32", ()), out: pnex.Out("f32", ())):
        if cuda.grid(1) == 0:
            out[()] = a[()] + 1

    torch.library.opcheck(scalar_tensor_op, (torch.tensor(2.0),))
