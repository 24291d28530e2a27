"""pnex.vload / pnex.vstore: several consecutive elements in one memory instruction.

CPU tensors run through numba-cuda's CUDA simulator; the PTX checks need NVVM (the
pip wheels); the GPU tests are marked ``gpu``."""

import re

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import KernelIndexError, KernelTypingError
from toolchain import needs_nvvm


def _axpb4(check: bool = False):
    @pnex.jit(n_threads="(a.numel() + 3) // 4", threads_per_block=32, check=check)
    def axpb4(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), s: float, out: pnex.Out("f32", "a")):
        i = cuda.grid(1) * 4
        if i + 4 <= a.shape[0]:
            x0, x1, x2, x3 = pnex.vload(a, i, 4)
            y0, y1, y2, y3 = pnex.vload(b, i, 4)
            pnex.vstore(out, i, (x0 * s + y0, x1 * s + y1, x2 * s + y2, x3 * s + y3))
        else:
            for k in range(i, a.shape[0]):  # the last, partial group
                out[k] = a[k] * s + b[k]

    return axpb4


def _close(got, a, b, s):
    ref = a.double() * s + b.double()
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 4, 1001, 4096])
def test_vload_vstore_in_the_simulator(n):
    op = _axpb4()
    a, b = torch.randn(n), torch.randn(n)
    _close(op(a, b, 0.5), a, b, 0.5)


@pytest.mark.parametrize(("dtype", "width"), [("f64", 2), ("i32", 4), ("f16", 8), ("i8", 16), ("u16", 2)])
def test_every_width_and_dtype_in_the_simulator(dtype, width):
    @pnex.jit(n_threads=f"(a.numel() + {width - 1}) // {width}", threads_per_block=16)
    def twice(a: pnex.In(dtype, (None,)), out: pnex.Out(dtype, "a")):
        i = cuda.grid(1) * width
        if i + width <= a.shape[0]:
            v = pnex.vload(a, i, width)
            pnex.vstore(out, i, v)
        else:
            for k in range(i, a.shape[0]):
                out[k] = a[k]

    t = {"f64": torch.float64, "i32": torch.int32, "f16": torch.float16, "i8": torch.int8, "u16": torch.uint16}[dtype]
    a = torch.randint(0, 100, (width * 5 + 1,)).to(t)
    assert torch.equal(twice(a).to(torch.int64) if t == torch.uint16 else twice(a),
                       a.to(torch.int64) if t == torch.uint16 else a)


@needs_nvvm
def test_the_ptx_holds_vector_instructions():
    op = _axpb4()
    ptx = op.definition.compiled("sm_90").ptx
    assert len(re.findall(r"ld\.global(\.nc)?\.v4\.f32", ptx)) == 2, ptx
    assert len(re.findall(r"st\.global\.v4\.f32", ptx)) == 1, ptx
    # The checked variant keeps the vector accesses where every element exists.
    checked = op.definition.compiled("sm_90", checked=True).ptx
    assert len(re.findall(r"ld\.global(\.nc)?\.v4\.f32", checked)) == 2
    assert len(re.findall(r"st\.global\.v4\.f32", checked)) == 1


@needs_nvvm
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("v = pnex.vload(a, i, 4)\n        out[i] = v[0] + v[1] + v[2] + v[3]", r"4 elements of float64 are 32 bytes"),
        ("w = i % 3 + 2\n        v = pnex.vload(a, i, w)\n        out[i] = v[0]", r"the width must be a constant"),
        ("pnex.vstore(a, i, (1.0, 2.0))", r"read-only"),
    ],
    ids=["too-wide", "variable-width", "into-an-In"],
)
def test_mistakes_give_a_clear_typing_error(body, message):
    source = (
        "def bad(a: pnex.In('f64', (None,)), out: pnex.Out('f64', 'a')):\n"
        "    i = cuda.grid(1)\n"
        "    if i < a.shape[0]:\n"
        f"        {body}\n"
    )
    namespace = {"pnex": pnex, "cuda": cuda}
    exec(compile(source, "<vector-test>", "exec"), namespace)
    with pytest.raises(KernelTypingError, match=message):
        pnex.jit(n_threads="a.numel()")(namespace["bad"])


def test_the_checked_variant_reports_a_vector_access_out_of_bounds():
    """check=True: each element of a vector access is checked, as for a slice; the
    error names the array, the element's index and the line."""

    @pnex.jit(n_threads="(a.numel() + 3) // 4", threads_per_block=4, check=True)
    def overrun(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1) * 4
        if i < a.shape[0]:  # the bug: the last group may be partial
            pnex.vstore(out, i, pnex.vload(a, i, 4))

    fine = torch.randn(16)
    torch.testing.assert_close(overrun(fine), fine)
    with pytest.raises(KernelIndexError, match=r"index 10 is out of bounds for axis 0 of parameter 'a' \(shape \(10,\)\), "
                                               r"at line \d+: `pnex.vstore\(out, i, pnex.vload\(a, i, 4\)\)`"):
        overrun(torch.randn(10))

    @pnex.jit(n_threads="a.numel()", threads_per_block=4, check=True)
    def before(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            v = pnex.vload(a, i - 2, 2)  # i - 2 < 0 for the first two threads: no wrap-around
            out[i] = v[0] + v[1]

    with pytest.raises(KernelIndexError, match=r"index -[12] is out of bounds for axis 0 of parameter 'a'"):
        before(torch.randn(8))


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_vector_access_on_the_gpu_aligned_and_not():
    op = _axpb4()
    for n in (1 << 20, 1001, 3):
        a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        _close(op(a, b, 0.25), a, b, 0.25)
    # A view one element in: no element is 16-byte aligned, every group takes the
    # element-by-element path, with the same result.
    base = torch.randn(4097, device="cuda")
    a, b = base[1:], torch.randn(4096, device="cuda")[:]
    out = op(a, b, 2.0)
    _close(out, a, b, 2.0)


@pytest.mark.gpu
def test_a_checked_vector_access_out_of_bounds_keeps_the_context():
    @pnex.jit(n_threads="(a.numel() + 3) // 4", check=True)
    def overrun_gpu(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1) * 4
        if i < a.shape[0]:
            pnex.vstore(out, i, pnex.vload(a, i, 4))

    a = torch.randn(1 << 12, device="cuda")
    torch.testing.assert_close(overrun_gpu(a), a)
    with pytest.raises(KernelIndexError, match=r"index 1002 is out of bounds for axis 0 of parameter 'a' "
                                               r"\(shape \(1002,\)\)"):
        overrun_gpu(torch.randn(1002, device="cuda"))
    assert torch.ones(4, device="cuda").sum().item() == 4.0
