"""Bad inputs to the tensor-core primitives (pnex.tc), without a GPU: each gets one clear
error, never a wrong result.  This file: the simulator raises, and a checked launch in the
simulator records and raises :class:`~pnex_magic.KernelIndexError` naming the primitive, the
operand, the line; correct kernels give the same results checked and unchecked; wrong dtypes are
typing errors at definition naming the primitive and the operand (and the same words from the
simulator).

tests/test_tc_checked_gpu.py runs the same kernels checked on a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pnex_magic as pnex
from pnex_magic import tc
from toolchain import needs_nvvm

sys.path.insert(0, str(Path(__file__).parent))
import tc_bad_kernels as B  # noqa: E402

from tc_checked_helpers import F16, both_refuse, both_run, line_of


# ----------------------------------------------------------------------------------------------- the simulator


def test_cp_async_spans():
    src = torch.randn(16, 64, generator=torch.Generator().manual_seed(1)).half()
    dst = both_run(B.cp_tile, (src,), B.GOOD["cp_tile"])
    assert torch.equal(dst[:, :64], src) and not dst[:, 64:].any()
    line = line_of(B.cp_tile, "tc.cp_async(s, (row, col + col_shift)")
    both_refuse(
        B.cp_tile, (src, 0, 1, 16), {},
        r"pnex\.tc\.cp_async: the span at index \d+ on axis 1 of the destination \(shape \(16, 72\)\) starts 2 bytes "
        r"past a 16-byte boundary",
        rf"cp_tile\(\): pnex\.tc\.cp_async destination: the span at index \d+ on axis 1 of shared array 's' \(shape "
        rf"\(16, 72\)\) starts 2 bytes past a 16-byte boundary of the array: its byte offset must be a multiple of 16, "
        rf"at line {line}: `tc\.cp_async\(s, \(row, col \+ col_shift\)",
    )
    both_run(B.cp_tile, (src, 0, 8, 16), {})  # the last chunk ends at column 72: in bounds
    both_refuse(B.cp_tile, (src, 0, 16, 16), {},
                r"index 72 is out of bounds for axis 1 of the destination",
                r"pnex\.tc\.cp_async destination: index 72 is out of bounds for axis 1 of shared array 's'")
    # the source: 8 elements from column 56 fit 64 columns, not 63 (row 0 only: valid_rows=1)
    both_run(B.cp_tile, (src, 0, 0, 1), {})
    narrow = torch.randn(16, 63).half()
    both_refuse(B.cp_tile, (narrow, 0, 0, 1), {},
                r"the 8 elements from index 56 on axis 1 of the source \(shape \(16, 63\)\) run past",
                r"pnex\.tc\.cp_async source: the 8 elements from index 56 on axis 1 of parameter 'src' \(shape "
                r"\(16, 63\)\) run past the axis's end \(63\)")
    both_refuse(B.cp_tile, (src, 1, 0, 16), {},
                r"index 16 is out of bounds for axis 0 of the source",
                r"pnex\.tc\.cp_async source: index 16 is out of bounds for axis 0 of parameter 'src'")
    # a source row that is not valid is not read: not checked either
    dst = both_run(B.cp_tile, (src, 1, 0, 15), {})
    assert torch.equal(dst[:15, :64], src[1:]) and not dst[15].any()
    # a tensor whose data starts 2 bytes past a 16-byte boundary
    shifted = torch.randn(16 * 64 + 1).half()[1:].view(16, 64)
    both_refuse(B.cp_tile, (shifted, 0, 0, 16), {},
                r"the source \(shape \(16, 64\)\) itself starts 2 bytes past a 16-byte boundary",
                r"pnex\.tc\.cp_async source: parameter 'src' \(shape \(16, 64\)\) itself starts 2 bytes past a 16-byte "
                r"boundary: pass a tensor whose data starts 16-byte aligned")


def test_ldmatrix_rows_and_fragments():
    tile = torch.randn(32, 16, generator=torch.Generator().manual_seed(2)).half()
    good = both_run(B.ld_tile, (tile,), B.GOOD["ld_tile"])
    # x2 reads the addresses of lanes 0-15 only: a bad address from lane 16 on is never used
    assert torch.equal(both_run(B.ld_tile, (tile, 1, 16, 2), {}), good)
    both_refuse(B.ld_tile, (tile, 1, 15, 2), {},
                r"pnex\.tc\.ldmatrix \(x2\): the 8 elements from index 9 on axis 1 of the tile",
                r"ld_tile\(\): pnex\.tc\.ldmatrix tile: the 8 elements from index 9 on axis 1 of shared array 's'.*"
                r"thread \(15, 0, 0\)")
    both_refuse(B.ld_tile, (tile, 8, 0, 2), {},
                r"index 16 is out of bounds for axis 1 of the tile",
                r"pnex\.tc\.ldmatrix tile: index 16 is out of bounds for axis 1 of shared array 's' \(shape \(32, 16\)\)")
    both_refuse(B.ld_tile, (tile, 0, 32, 1), {},
                r"the fragment \(shape \(1,\)\) has 1 elements; the fragment must have at least 2",
                r"pnex\.tc\.ldmatrix fragment: 'frag\[0:n\]' \(shape \(1,\)\) has 1 elements; the fragment must have at "
                r"least 2")
    both_refuse(B.ld_undeclared, (tile,), {},
                r"the tile \(shape \(32, 16\)\) was declared with alignment=2 \(Numba's default is the element size\)",
                r"pnex\.tc\.ldmatrix tile: shared array 's' \(shape \(32, 16\)\) was declared with alignment=2 .*"
                r"declare it with cuda\.shared\.array\(\.\.\., alignment=128\)")


def test_mma_fragments_and_whole_warps():
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(3))
    both_run(B.mma_len, (x,), B.GOOD["mma_len"])
    for kwargs, operand, variable, n, want in (
        (dict(nc=3, na=4, nb=2), "accumulator", r"acc\[0:nc\]", 3, 4),
        (dict(nc=5, na=4, nb=2), "accumulator", r"acc\[0:nc\]", 5, 4),
        (dict(nc=4, na=3, nb=2), "A fragment", r"af\[0:na\]", 3, 4),
        (dict(nc=4, na=4, nb=3), "B fragment", r"bf\[0:nb\]", 3, 2),
    ):
        both_refuse(B.mma_len, (x,), kwargs,
                    rf"pnex\.tc\.mma: the {operand} \(shape \({n},\)\) has {n} elements; the fragment must have "
                    rf"exactly {want}",
                    rf"pnex\.tc\.mma {operand}: '{variable}' \(shape \({n},\)\) has {n} elements")
    both_refuse(B.mma_partial_warp, (x,), {},
                r"pnex\.tc\.mma: every thread of a warp must take part, but the block's 48 threads leave the last "
                r"warp short of 32",
                r"mma_partial_warp\(\): pnex\.tc\.mma accumulator: every thread of a warp must take part")


def test_store_pair_spans():
    out = both_run(B.pairs, (0,), {})
    lanes = torch.arange(32)
    assert torch.equal(out[lanes // 8, 2 * (lanes % 8)], lanes.half())
    assert torch.equal(out[lanes // 8, 2 * (lanes % 8) + 1], -lanes.half())
    both_run(B.pairs, (2,), {})  # the last pair at columns 16, 17 of 18
    both_refuse(B.pairs, (1,), {}, r"starts 2 bytes past a 4-byte boundary",
                r"pnex\.tc\.store_pair array: the span at index \d+ on axis 1 of parameter 'out' \(shape \(4, 18\)\) "
                r"starts 2 bytes past a 4-byte boundary")
    both_refuse(B.pairs, (4,), {}, r"index 18 is out of bounds for axis 1 of the array",
                r"pnex\.tc\.store_pair array: index 18 is out of bounds for axis 1 of parameter 'out'")


def _wgmma_reference(a, b):
    from pnex_magic.tc.simulate import _wgmma_c_layout

    d = (a[:, :16].double() @ b[:, :16].double().t()).float()
    rows, cols = _wgmma_c_layout(16)
    return d[torch.as_tensor(np.array(rows[:, :8])), torch.as_tensor(np.array(cols[:, :8]))]


def test_wgmma_tiles():
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(64, 64, generator=gen).half(), torch.randn(16, 64, generator=gen).half()
    good = B.GOOD["wg_tile"]
    out = both_run(B.wg_tile, (a, b), good)
    torch.testing.assert_close(out, _wgmma_reference(a, b), rtol=1e-5, atol=1e-5)
    cases = (
        (dict(r0=4), r"index 4 on axis 1 of the A tile \(shape \(2, 68, 64\)\) must be a multiple of 8",
         r"pnex\.tc\.wgmma A tile: index 4 on axis 1 of shared array 'sa' \(shape \(2, 68, 64\)\) must be a multiple "
         r"of 8"),
        (dict(c0=8), r"index 8 on axis 2 of the A tile .* must be a multiple of 16",
         r"pnex\.tc\.wgmma A tile: index 8 on axis 2 of shared array 'sa'"),
        (dict(r0=8), r"the 64 rows from index 8 on axis 1 of the A tile \(shape \(2, 68, 64\)\) run past the axis's "
         r"end \(68\)", r"pnex\.tc\.wgmma A tile: the 64 rows from index 8 on axis 1 of shared array 'sa'"),
        (dict(m=7), r"the accumulator \(shape \(7,\)\) has 7 elements; the fragment must have at least 8",
         r"pnex\.tc\.wgmma accumulator: 'acc\[0:m\]' \(shape \(7,\)\) has 7 elements"),
        (dict(plane=1), r"the span at index 0 on axis 1 of the A tile .* starts 512 bytes past a 1024-byte boundary",
         r"pnex\.tc\.wgmma A tile: the span at index 0 on axis 1 of shared array 'sa' .* starts 512 bytes past a "
         r"1024-byte boundary"),
        (dict(which=1), r"the 16 rows from index 0 on axis 0 of the B tile \(shape \(8, 64\)\) run past",
         r"pnex\.tc\.wgmma B tile: the 16 rows from index 0 on axis 0 of shared array 'sb8'"),
        (dict(which=2), r"the B tile \(shape \(32, 32\)\) must have contiguous rows of 64 16-bit elements",
         r"pnex\.tc\.wgmma B tile: shared array 'sb32' \(shape \(32, 32\)\) must have contiguous rows of 64"),
        (dict(which=3), r"the A tile \(shape \(64, 64\)\) was declared with alignment=128",
         r"pnex\.tc\.wgmma A tile: shared array 'sc' \(shape \(64, 64\)\) was declared with alignment=128 .*"
         r"alignment=1024\)"),
    )
    for change, plain, in_checked in cases:
        both_refuse(B.wg_tile, (a, b), {**good, **change}, plain, in_checked)


def test_a_lane_that_leaves_before_a_warp_collective_is_an_error_not_a_hang():
    x = torch.randn(32)
    with pytest.raises(pnex.KernelLaunchError,
                       match=r"(?s)threads 0-4, 6-31 of block \(0, 0, 0\) wait at the warp-level warp_sum of warp 0 "
                             r"\(lane 5 of the warp has not come\).*thread 5 of block \(0, 0, 0\) has returned"):
        B.lane_leaves(x, 5, 0)
    for _ in range(3):  # a lane's own error, not the wait it leaves the others in
        with pytest.raises(pnex.KernelLaunchError, match=r"IndexError"):
            B.lane_leaves(x, 7, 1)
    torch.testing.assert_close(B.lane_leaves(x, 32, 0), x.sum().expand(32), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- wrong dtypes


@pytest.mark.parametrize("call, message", [
    (lambda: tc.mma(np.zeros(4, np.float64), np.zeros(4, np.uint32), np.zeros(2, np.uint32)),
     r"pnex\.tc\.mma: the accumulator must hold float32, got float64"),
    (lambda: tc.mma_bf16(np.zeros(4, np.float32), np.zeros(4, F16), np.zeros(2, np.uint32)),
     r"pnex\.tc\.mma_bf16: the A fragment must hold uint32 or int32, got float16"),
    (lambda: tc.ldmatrix(np.zeros(4, np.float32), np.zeros((8, 8), F16), (0, 0)),
     r"pnex\.tc\.ldmatrix \(x4\): the fragment must hold uint32 or int32, got float32"),
    (lambda: tc.ldmatrix(np.zeros(4, np.uint32), np.zeros((8, 8), np.float32), (0, 0)),
     r"pnex\.tc\.ldmatrix \(x4\): the tile must hold 16-bit elements"),
    (lambda: tc.cp_async(np.zeros((8, 8), F16), (0, 0), np.zeros((8, 8), np.float32), (0, 0)),
     r"pnex\.tc\.cp_async: the destination holds 2-byte elements \(float16\) and the source 4-byte ones \(float32\)"),
    (lambda: tc.store_pair(np.zeros((8, 8), np.float32), (0, 0), 1.0, 2.0),
     r"pnex\.tc\.store_pair: the array must hold float16 or bfloat16, got float32"),
    (lambda: tc.wgmma(np.zeros(8, F16), np.zeros((64, 64), F16), (0, 0), np.zeros((16, 64), F16), (0, 0), 16),
     r"pnex\.tc\.wgmma \(m64n16k16\): the accumulator must hold float32, got float16"),
])
def test_the_simulator_refuses_wrong_dtypes_in_the_typing_errors_words(call, message):
    with pytest.raises(TypeError, match=message):
        call()


@needs_nvvm
def test_wrong_dtypes_are_typing_errors_naming_the_primitive_and_the_operand():
    from numba import cuda, float32, float64, uint32
    from numba.cuda.types import float16

    cases = []

    def case(pattern):
        def wrap(fn):
            cases.append((fn, pattern))
            return fn
        return wrap

    @case(r"pnex\.tc\.mma: the A fragment must hold uint32 or int32, got float16")
    def mma_a(out: pnex.Out("f32", (4,))):
        acc = cuda.local.array(4, float32)
        af = cuda.local.array(4, float16)
        bf = cuda.local.array(2, uint32)
        tc.mma(acc, af, bf)
        out[0] = acc[0]

    @case(r"pnex\.tc\.mma_bf16: the accumulator must hold float32, got float64")
    def mma_acc(out: pnex.Out("f32", (4,))):
        acc = cuda.local.array(4, float64)
        af = cuda.local.array(4, uint32)
        bf = cuda.local.array(2, uint32)
        tc.mma_bf16(acc, af, bf)
        out[0] = acc[0]

    @case(r"pnex\.tc\.ldmatrix: the fragment must hold uint32 or int32, got float32")
    def ld_frag(out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((8, 8), float16, alignment=128)
        frag = cuda.local.array(4, float32)
        tc.ldmatrix(frag, s, (0, 0))
        out[0] = frag[0]

    @case(r"pnex\.tc\.ldmatrix: the tile must be a shared array of 16-bit elements")
    def ld_tile32(out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((8, 8), float32, alignment=128)
        frag = cuda.local.array(4, uint32)
        tc.ldmatrix(frag, s, (0, 0))
        out[0] = frag[0]

    @case(r"pnex\.tc\.cp_async: the destination holds 2-byte elements \(float16\) and the source 4-byte ones "
          r"\(float32\)")
    def cp_sizes(a: pnex.In("f32", (8, 8)), out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((8, 8), float16, alignment=128)
        tc.cp_async(s, (0, 0), a, (0, 0))
        out[0] = s[0, 0]

    @case(r"pnex\.tc\.cp_async: 1 subscripts for the 2-D destination")
    def cp_rank(a: pnex.In("f16", (8, 8)), out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((8, 8), float16, alignment=128)
        tc.cp_async(s, 0, a, (0, 0))
        out[0] = s[0, 0]

    @case(r"pnex\.tc\.store_pair: the array must hold float16 or bfloat16, got float32")
    def pair32(out: pnex.Out("f32", (4,))):
        tc.store_pair(out, 0, 1.0, 2.0)

    @case(r"pnex\.tc\.wgmma: the accumulator must hold float32, got float16")
    def wg_acc(out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((64, 64), float16, alignment=1024)
        acc = cuda.local.array(8, float16)
        tc.wgmma(acc, s, (0, 0), s, (0, 0), 16)
        out[0] = acc[0]

    @case(r"pnex\.tc\.wgmma: the B tile must be a shared array of 16-bit elements")
    def wg_tile32(out: pnex.Out("f32", (4,))):
        s = cuda.shared.array((64, 64), float16, alignment=1024)
        t = cuda.shared.array((16, 64), float32, alignment=1024)
        acc = cuda.local.array(8, float32)
        tc.wgmma(acc, s, (0, 0), t, (0, 0), 16)
        out[0] = acc[0]

    for fn, pattern in cases:
        with pytest.raises(pnex.KernelTypingError, match=pattern):
            pnex.jit(n_threads=32, threads_per_block=32)(fn)
