"""Bad inputs to the tensor-core primitives (pnex.tc), without a GPU: each gets one clear
error, never a wrong result.

* the rules (:mod:`pnex_magic.tc.rules`) on NumPy arrays, with their boundaries (an
  off-by-one in a span, an alignment, a fragment's length must be caught);
* the simulator raises, and a checked launch in the simulator records and raises
  :class:`~pnex_magic.KernelIndexError` naming the primitive, the operand, the line;
  correct kernels give the same results checked and unchecked;
* the checked variant's rewrite, and its GPU code: every kernel here compiles checked
  to a cubin for sm_90 (NVVM and nvJitLink wheels), the checks inlined;
* wrong dtypes are typing errors at definition naming the primitive and the operand
  (and the same words from the simulator); wgmma outside sm_90 and mma below sm_80 are
  refused; ``backward="auto"`` refuses the primitives by line; the examples refuse
  shapes their tiles do not divide.

tests/test_tc_checked_gpu.py runs the same kernels checked on a GPU.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pnex_magic as pnex
from pnex_magic import checking as C
from pnex_magic import tc
from pnex_magic.launch import checks
from pnex_magic.tc import arrays, rules, usage
from toolchain import needs_nvvm

sys.path.insert(0, str(Path(__file__).parent))
import tc_bad_kernels as B  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
F16 = np.float16


def checked(op, *args, **kwargs):
    """``op``'s checked launch (its checked variant, in the simulator for CPU tensors)."""
    with checks.checked_launches(op._pnex):
        return op(*args, **kwargs)


def both_refuse(op, args, kwargs, plain, in_checked):
    """The simulator refuses the call (``plain`` matches its message) and the checked
    launch records it (``in_checked`` matches the KernelIndexError's)."""
    with pytest.raises(pnex.KernelLaunchError, match=plain):
        op(*args, **kwargs)
    with pytest.raises(pnex.KernelIndexError, match=in_checked) as info:
        checked(op, *args, **kwargs)
    return info.value


def both_run(op, args, kwargs):
    """The same result unchecked and checked (no violation recorded)."""
    plain = op(*args, **kwargs)
    again = checked(op, *args, **kwargs)
    assert torch.equal(plain, again)
    return plain


def line_of(op, text):
    lines = Path(op._pnex.fn.__code__.co_filename).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)


# ----------------------------------------------------------------------------------------------- the rules


def _aligned(shape, dtype, declared):
    return arrays.declare(np.zeros(shape, dtype), declared)


def test_a_span_lies_in_bounds_along_the_last_axis():
    t = _aligned((4, 64), F16, 128)
    assert rules.span(t, (0, 56), 8, 16, "w") is None  # the last 8 elements: 56 + 8 == 64
    assert rules.span(t, (3, 0), 8, 16, "w") is None
    f = rules.span(t, (0, 57), 8, 16, "w")  # one past: the span runs over (checked before the alignment)
    assert (f.code, f.axis, f.index, f.param) == (rules.RANGE, 1, 57, 8)
    f = rules.span(t, (0, 64), 8, 16, "w")
    assert (f.code, f.axis, f.index) == (rules.BOUNDS, 1, 64)
    f = rules.span(t, (4, 0), 8, 16, "w")
    assert (f.code, f.axis, f.index) == (rules.BOUNDS, 0, 4)
    f = rules.span(t, (-1, 0), 8, 16, "w")  # no wrap-around: the instruction takes an address
    assert (f.code, f.axis, f.index) == (rules.BOUNDS, 0, -1)
    with pytest.raises(IndexError, match="1 subscripts for a 2-D array"):
        rules.span(t, 3, 8, 16, "w")
    # a span of 2 (store_pair) may end at the last element
    assert rules.span(t, (0, 62), 2, 4, "w") is None
    assert rules.span(t, (0, 63), 2, 4, "w").code == rules.RANGE


def test_a_span_starts_aligned_as_far_as_the_gpu_guarantees():
    t = _aligned((4, 64), F16, 128)
    assert rules.span(t, (1, 8), 8, 16, "w") is None
    f = rules.span(t, (1, 4), 8, 16, "w")  # (64 + 4) * 2 = 136 bytes: 8 past a 16-byte boundary
    assert (f.code, f.param, f.a, f.b) == (rules.ALIGN, 16, 8, 8)
    assert rules.span(t, (1, 2), 2, 4, "w") is None  # store_pair needs 4 bytes only
    assert rules.span(t, (1, 1), 2, 4, "w").code == rules.ALIGN
    # a shared tile declared with less than the instruction needs is refused, wherever NumPy put it
    for declared, code in ((2, rules.DECLARED), (8, rules.DECLARED), (16, None)):
        f = rules.span(_aligned((4, 64), F16, declared), (0, 0), 8, 16, "w")
        assert (f.code, f.param, f.a) == (code, 16, declared) if code else f is None
    # a view of a shared tile: its offset within the allocation counts
    view = _aligned((8 * 64 + 8,), F16, 1024)[8:].reshape(8, 64)
    assert rules.span(view, (0, 0), 8, 16, "w") is None
    assert rules.wgmma_tile(view, (0, 0), 8, "w").code == rules.ALIGN  # 16 bytes in, not 1024
    # any other array (a tensor): its real address
    raw = np.zeros(256, np.uint8)
    start = (-raw.ctypes.data) % 16
    good = raw[start:start + 128].view(F16).reshape(1, 64)
    bad = raw[start + 2:start + 130].view(F16).reshape(1, 64)
    assert rules.span(good, (0, 8), 8, 16, "w") is None
    f = rules.span(bad, (0, 8), 8, 16, "w")
    assert (f.code, f.a, f.b) == (rules.ALIGN, 2, 0)  # the array itself is off, not the index
    # a bfloat16 shadow (float32 storage) counts 2-byte elements
    shadow = np.zeros((2, 64), np.float32).view(arrays.Bf16Shadow)
    assert rules.span(shadow, (1, 8), 8, 16, "w") is None
    assert rules.span(shadow, (1, 4), 8, 16, "w").b == 8


def test_a_span_is_contiguous():
    t = _aligned((64, 16), F16, 128).T  # the last axis strides 32 bytes
    f = rules.span(t, (0, 0), 8, 16, "w")
    assert (f.code, f.index, f.param) == (rules.CONTIGUOUS, 32, 2)


def test_fragments_have_their_lengths():
    assert rules.fragment(np.zeros(4, np.float32), 4, True, "w") is None
    for n in (3, 5):
        f = rules.fragment(np.zeros(n, np.float32), 4, True, "w")
        assert (f.code, f.index, f.param, f.a) == (rules.FRAGMENT, n, 4, 1)
    assert rules.fragment(np.zeros(5, np.uint32), 4, False, "w") is None  # ldmatrix, wgmma: at least
    assert rules.fragment(np.zeros(3, np.uint32), 4, False, "w").code == rules.FRAGMENT
    with pytest.raises(TypeError, match="w must be a 1-D array view"):
        rules.fragment(np.zeros((2, 4), np.float32), 4, True, "w")
    with pytest.raises(TypeError, match="w must hold uint32 or int32, got float16"):
        rules.fragment_dtype(np.zeros(4, F16), ("uint32", "int32"), "w")


def test_a_wgmma_operand_starts_at_a_row_multiple_of_8_and_a_column_multiple_of_16():
    t = _aligned((2, 68, 64), F16, 1024)
    assert rules.wgmma_tile(t, (0, 0, 0), 64, "w") is None
    assert rules.wgmma_tile(t, (0, 0, 48), 64, "w") is None  # the last 16 columns
    assert rules.wgmma_tile(t, (0, 0, 0), 68, "w") is None  # every row
    f = rules.wgmma_tile(t, (0, 0, 0), 69, "w")
    assert (f.code, f.axis, f.index, f.param) == (rules.RANGE, 1, 0, 69)
    f = rules.wgmma_tile(t, (0, 8, 0), 64, "w")  # 8 + 64 > 68
    assert (f.code, f.axis, f.index) == (rules.RANGE, 1, 8)
    f = rules.wgmma_tile(t, (0, 4, 0), 8, "w")
    assert (f.code, f.axis, f.index, f.param) == (rules.MULTIPLE, 1, 4, 8)
    f = rules.wgmma_tile(t, (0, 0, 8), 8, "w")
    assert (f.code, f.axis, f.index, f.param) == (rules.MULTIPLE, 2, 8, 16)
    f = rules.wgmma_tile(t, (1, 0, 0), 64, "w")  # plane 1: 68 * 128 = 8704 bytes in
    assert (f.code, f.param, f.a, f.b) == (rules.ALIGN, 1024, 512, 512)
    assert rules.wgmma_tile(_aligned((2, 72, 64), F16, 1024), (1, 0, 0), 64, "w") is None  # 72 rows: aligned
    f = rules.wgmma_tile(_aligned((32, 32), F16, 1024), (0, 0), 8, "w")
    assert (f.code, f.index, f.a, f.b) == (rules.ROWS, 32, 2, 64)
    f = rules.wgmma_tile(_aligned((64, 64), F16, 128), (0, 0), 64, "w")
    assert (f.code, f.param, f.a) == (rules.DECLARED, 1024, 128)


def test_a_fault_packs_into_the_record_and_reads_back():
    f = rules.Fault(rules.ALIGN, 1, 49, (16, 72), 16, 2, 2)
    assert rules.unpack(f.word()) == (rules.ALIGN, 16, 2, 2)
    assert rules.unpack(rules.Fault(rules.ROWS, 1, 32, (32, 32), 64, 70000, 64).word()) == (rules.ROWS, 64, 65535, 64)
    record = [1, 0, 1, 49, 2, 16, 72, 0, 0, 48, 0, 0, 0, 0, 0, f.word()]
    sites = (C.Site(0, "s", 26, "tc.cp_async(s, i, a, j)", "store", "shared array", "pnex.tc.cp_async destination"),)
    assert C.decode_record(record).rule == f.word()
    assert C.describe_violation("k", record, sites) == (
        "k(): pnex.tc.cp_async destination: the span at index 49 on axis 1 of shared array 's' (shape (16, 72)) "
        "starts 2 bytes past a 16-byte boundary of the array: its byte offset must be a multiple of 16, at line 26: "
        "`tc.cp_async(s, i, a, j)`, thread (48, 0, 0) of block (0, 0, 0)"
    )
    # an index out of bounds of a tc operand: the plain sentence, after the operand
    plain = record[:15] + [0]
    plain[3] = 72
    assert "pnex.tc.cp_async destination: index 72 is out of bounds for axis 1 of shared array 's'" in (
        C.describe_violation("k", plain, sites))


# ----------------------------------------------------------------------------------------------- the rewrite


def _rewritten(fn):
    """The statements of ``fn``'s checked variant, as source."""
    from pnex_magic.checking import variant
    from pnex_magic.checking.index_ranges import IndexRanges
    from pnex_magic.checking.rewrite import Rewriter

    source = C.kernel_source(fn)
    fdef, namespace = source.fdef, C.namespace_of(fn)
    params = {a.arg for a in fdef.args.args}
    rewriter = Rewriter(dict(source.lines), params, {}, IndexRanges(fdef, namespace, None, None),
                        variant._primitives(fdef, params, namespace))
    return [ast.unparse(stmt) for stmt in rewriter.visit_block(fdef.body)]


mma_bf16_alias = tc.mma_bf16


def uses_tc(frag, tile, acc, a, b, out, mma):  # `mma` here is a parameter: not the primitive
    tc.ldmatrix(frag, tile, (0, 0), trans=True)
    pnex.tc.mma(acc, a, b)
    mma_bf16_alias(acc[0:4], a, b)
    mma(acc, a, b)
    tc.store_pair(out, (0, 2), acc[0], acc[1])


def test_the_rewrite_gives_each_operand_a_site_and_fills_in_defaults():
    assert _rewritten(uses_tc) == [
        "__pnex_tc_ldmatrix(__pnex_err, 0, frag, tile, (0, 0), 4, True)",  # count's default, trans by name
        "__pnex_tc_mma(__pnex_err, 2, acc, a, b)",  # pnex.tc.mma
        "__pnex_tc_mma_bf16(__pnex_err, 5, acc[0:4], a, b)",  # a global bound to tc.mma_bf16
        "mma(acc, a, b)",  # a parameter named mma is not the primitive
        "__pnex_tc_store_pair(__pnex_err, 8, out, (0, 2), __pnex_load(acc, __pnex_err, 9, 0), "
        "__pnex_load(acc, __pnex_err, 10, 1))",
    ]
    ck = C.checked_kernel(uses_tc)
    assert [(s.variable, s.operand) for s in ck.sites] == [
        ("frag", "pnex.tc.ldmatrix fragment"), ("tile", "pnex.tc.ldmatrix tile"),
        ("acc", "pnex.tc.mma accumulator"), ("a", "pnex.tc.mma A fragment"), ("b", "pnex.tc.mma B fragment"),
        ("acc[0:4]", "pnex.tc.mma_bf16 accumulator"), ("a", "pnex.tc.mma_bf16 A fragment"),
        ("b", "pnex.tc.mma_bf16 B fragment"),
        ("out", "pnex.tc.store_pair array"),
        ("acc", ""), ("acc", ""),  # acc[0] and acc[1]: plain loads
    ]
    assert {s.role for s in ck.sites if s.variable == "out"} == {"parameter"}
    assert {"__pnex_tc_ldmatrix", "__pnex_tc_mma", "__pnex_tc_store_pair"} <= set(ck.function.__code__.co_names)


def test_checked_kernels_name_their_tc_sites():
    ck = B.cp_tile._pnex.checked_kernel()
    tc_sites = [(s.variable, s.role, s.operand, s.kind) for s in ck.sites if s.operand]
    assert tc_sites == [("s", "shared array", "pnex.tc.cp_async destination", "store"),
                        ("src", "parameter", "pnex.tc.cp_async source", "load")]


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


# ----------------------------------------------------------------------------------------------- GPU code, checked


@needs_nvvm
@pytest.mark.parametrize("name", ["cp_tile", "ld_tile", "mma_len", "pairs", "wg_tile"])
def test_checked_variants_compile_to_cubins_with_the_checks_inlined(name):
    import re

    definition = getattr(B, name)._pnex
    fast = definition.compiled("sm_90")
    assert "atom.global.cas" not in fast.ptx  # the fast variant has no checks
    compiled = definition.compiled("sm_90", checked=True)
    assert compiled.cubin is not None and compiled.cubin[:4] == b"\x7fELF"
    ptx = compiled.ptx
    assert "atom.global.cas.b64" in ptx  # the record's compare-and-swap
    called = set(re.findall(r"call\.uni[^;]*?\n\s*([\w$]+),", ptx))
    external = set(re.findall(r"\.extern\s+\.func\s*(?:\([^)]*\))?\s*([\w$]+)", ptx))
    assert called <= external, called - external  # every check inlined
    instruction = {"cp_tile": "cp.async.cg.shared.global", "ld_tile": "ldmatrix.sync.aligned.m8n8.x2",
                   "mma_len": "mma.sync.aligned.m16n8k16", "pairs": "cvt.rn.f16x2.f32",
                   "wg_tile": "wgmma.mma_async.sync.aligned.m64n16k16"}[name]
    assert instruction in ptx
    if name in ("ld_tile", "mma_len"):
        assert "vote.sync.all.pred" in ptx  # the warp runs it or skips it together
    if name == "wg_tile":
        assert "bar.red.and.pred" in ptx  # the warpgroup likewise
        assert compiled.arch == "sm_90" and "sm_90a" in compiled.link_log


# ----------------------------------------------------------------------------------------------- architectures


def test_wgmma_exists_on_sm90_only_and_mma_from_sm80():
    wg = B.wg_tile._pnex
    assert usage.arch_problem(wg.snapshot.function, (9, 0)) is None
    for arch in ("sm_80", "sm_89", "sm_100", "sm_120"):
        with pytest.raises(pnex.KernelDefinitionError,
                           match=rf"kernel 'wg_tile' calls pnex\.tc\.wgmma\w*, which exists on sm_90 only .*"
                                 rf"it cannot be compiled for {arch}"):
            wg.target_arch(arch)
    assert wg.target_arch("sm_90") == "sm_90"
    if not torch.cuda.is_available() and "PNEX_ARCH" not in __import__("os").environ:
        assert wg.target_arch() == "sm_90"  # the stand-in architecture becomes the one it needs
    mma = B.mma_len._pnex
    assert mma.target_arch("sm_100") == "sm_100"
    with pytest.raises(pnex.KernelDefinitionError, match=r"calls pnex\.tc\.mma, which needs sm_80 or newer"):
        mma.target_arch("sm_75")
    # store_pair converts with cvt.rn.f16x2.f32, which ptxas refuses below sm_80
    with pytest.raises(pnex.KernelDefinitionError, match=r"calls pnex\.tc\.store_pair, which needs sm_80 or newer"):
        B.pairs._pnex.target_arch("sm_75")


def test_saving_a_wgmma_kernel_for_another_architecture_is_refused_before_compiling():
    from pnex_magic.multiarch import build_images

    with pytest.raises(pnex.KernelDefinitionError, match=r"exists on sm_90 only .* cannot be compiled for sm_100"):
        build_images(B.wg_tile._pnex, ("sm_90", "sm_100"))


# ----------------------------------------------------------------------------------------------- gradients


def test_the_derived_backward_refuses_tensor_cores_by_line():
    line = line_of(B.mma_len, "af[r] = tc.pack_f16x2(")  # the first call of a primitive
    with pytest.raises(pnex.KernelDefinitionError,
                       match=rf"derive_backward\(mma_len\), line {line} \(`af\[r\] = tc\.pack_f16x2\(float32\(r\), "
                             rf"float32\(lane % 3\)\)`\): pnex\.tc\.pack_f16x2 \(tensor cores\) has no derivative rule: "
                             rf"derive_backward cannot differentiate it\. .*attach it with pnex\.attach_backward"):
        pnex.derive_backward(B.mma_len)
    with pytest.raises(pnex.KernelDefinitionError, match=rf"derive_backward\(wg_tile\), line \d+ .*pnex\.tc\.swizzle"):
        pnex.derive_backward(B.wg_tile)


def test_backward_auto_refuses_a_device_function_that_calls_tensor_cores():
    from numba import cuda, float32

    @cuda.jit(device=True)
    def warp_total(x):
        return tc.warp_sum(x)

    with pytest.raises(pnex.KernelDefinitionError,
                       match=r"pnex\.tc\.warp_sum \(tensor cores\) has no derivative rule.*the device function "
                             r"warp_total calls it at .*test_tc_checked\.py:\d+"):
        @pnex.jit(n_threads=32, threads_per_block=32, backward="auto")
        def summed(x: pnex.In("f32", (32,)), y: pnex.Out("f32", (32,))):
            i = cuda.threadIdx.x
            y[i] = warp_total(x[i]) * float32(2.0)


# ----------------------------------------------------------------------------------------------- the examples' tiles


def test_the_gemm_example_refuses_shapes_its_tiles_do_not_divide_before_launching():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_mma import make_gemm

    from pnex_magic.report import _definition_of

    gemm = make_gemm("f16", 32, 32, 2)
    assert _definition_of(gemm, "test") is gemm._pnex  # pnex.inspect and the report see the op
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(32, 64, generator=gen).half(), torch.randn(64, 32, generator=gen).half()
    c = gemm(a, b)
    assert ((c.double() - a.double() @ b.double()).abs() <= (a.double() @ b.double()).abs() * 2**-10 + 1e-2).all()
    for bad_a, bad_b, pattern in (
        (torch.randn(33, 64), b, r"gemm\(\): the call breaks requires\[0\] `a\.size\(0\) % 32 == 0` \(a\.size\(0\) = "
                                 r"33\): M must be a multiple of the block tile BM = 32; the kernel computes whole tiles"),
        (a, torch.randn(64, 48), r"requires\[1\] `b\.size\(1\) % 32 == 0` \(b\.size\(1\) = 48\): N must be a "
                                 r"multiple of the block tile BN = 32"),
        (torch.randn(32, 48), torch.randn(48, 32), r"\(a\.size\(1\) = 48\): K must be a multiple of the k-tile BK"),
    ):
        with pytest.raises(pnex.ArgumentValueError, match=pattern):
            gemm(bad_a.half(), bad_b.half())
    compiled = torch.compile(lambda x, y: gemm(x, y) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a, b), c * 2)
    with pytest.raises(Exception, match=r"\(a\.size\(1\) = 48\): K must be a multiple of the k-tile BK = 32"):
        compiled(torch.randn(32, 48).half(), torch.randn(48, 32).half())


def test_the_wgmma_and_attention_examples_refuse_shapes_their_tiles_do_not_divide():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_wgmma import make_linear

    linear = make_linear("f16", 64, 128, 2, pipelined=False, dynamic=False)
    w = torch.randn(128, 64).half()
    for a, weight, pattern in (
        (torch.randn(96, 64), w, r"\(a\.size\(0\) = 96\): M must be a multiple of the block tile BM = 64"),
        (torch.randn(64, 64), torch.randn(192, 64), r"\(w\.size\(0\) = 192\): N must be a multiple of the widest"),
        (torch.randn(64, 96), torch.randn(128, 96), r"\(a\.size\(1\) = 96\): K must be a multiple of the k-tile BK"),
        (torch.randn(64, 0), torch.randn(128, 0), r"`a\.size\(1\) % 64 == 0 and a\.size\(1\) >= 64` \(a\.size\(1\) = 0\): "
                                                  r"K must be a multiple of the k-tile BK = 64 and at least 64"),
    ):
        with pytest.raises(pnex.ArgumentValueError, match=pattern):
            linear(a.half(), weight.half())
    from attention import make_attention

    try:
        attention = make_attention("f16", 64)
    except TypeError as exc:  # pnex.jit(shared_bytes=...) is newer than this checkout
        pytest.skip(f"the attention example needs dynamic shared memory: {exc}")
    q = torch.randn(1, 1, 96, 64).half()
    with pytest.raises(pnex.ArgumentValueError, match=r"\(q\.size\(2\) = 96\): the query length must be a multiple"):
        attention(q, q, q, 0.125)


# ----------------------------------------------------------------------------------------------- GPU checks = rules


def _gpu_form(body: str, params: str):
    """The GPU's generated check code (:mod:`pnex_magic.checking.tc_overloads`) run as
    Python on NumPy arrays: addresses are the arrays' real ones, as on the GPU."""
    recorded = []

    def address(x, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        return x.ctypes.data + sum(int(i) * s for i, s in zip(idx, x.strides))

    namespace = {"uint64": lambda v: int(v) % 2**64, "int64": int, "_address": address,
                 "_data": lambda x: x.ctypes.data,
                 "_record": lambda err, site, x, axis, index, rule: recorded.append((axis, int(index), int(rule)))}
    exec(f"def check(err, site, {params}):\n    ok = True\n    if ok:\n{body}    return ok\n", namespace)  # noqa: S102

    def run(*args):
        recorded.clear()
        ok = namespace["check"](None, 0, *args)
        assert ok == (not recorded)
        return recorded[0] if recorded else None

    return run


def _expected(fault):
    return None if fault is None else (fault.axis, fault.index, fault.word())


def _aligned_buffer(nbytes):
    """A shared-like 1024-byte aligned buffer, declared so (the simulator's and the
    GPU's alignment then agree)."""
    raw = np.zeros(nbytes + 1024, np.uint8)
    start = (-raw.ctypes.data) % 1024
    return arrays.declare(raw[start:start + nbytes], 1024)


def test_the_gpu_checks_are_the_simulators_rules_on_random_spans():
    from pnex_magic.checking import tc_overloads as G

    rng = np.random.default_rng(12)
    buffer = _aligned_buffer(1 << 16)
    seen = set()
    for _ in range(400):
        dtype = rng.choice([np.float16, np.float32])
        size = np.dtype(dtype).itemsize
        rows, cols = int(rng.integers(1, 9)), int(rng.choice([8, 16, 24, 63, 64, 72]))
        offset = int(rng.choice([0, 0, 2, 4, 16, 64, 128]))
        base = buffer[offset:offset + 2 * 72 * 72 * size].view(dtype)
        shape = rng.integers(4)
        if shape == 0:
            x = base[: 2 * rows * cols].reshape(2 * rows, cols)[::2]  # rows strided
        elif shape == 1:
            x = base[: cols * cols].reshape(cols, cols).T  # the last axis not contiguous
            rows = cols
        else:
            x = base[: rows * cols].reshape(rows, cols)
        count, need = [(16 // size, 16), (2, 4), (8, 16)][int(rng.integers(3))]
        row = int(rng.integers(0, rows)) if rng.random() < 0.9 else int(rng.choice([-1, rows]))
        col = int(rng.choice([0, 1, 2, 8, cols - count, cols - count + 1, cols - 1, cols, -1]))
        gpu = _gpu_form(G._span("x", "idx", 2, count, need, size, "site"), "x, idx")
        want = rules.span(x, (row, col), count, need, "w")
        assert gpu(x, (row, col)) == _expected(want), (x.shape, x.strides, (row, col), count, need)
        seen.add(None if want is None else want.code)
    assert seen == {None, rules.BOUNDS, rules.RANGE, rules.CONTIGUOUS, rules.ALIGN}


def test_the_gpu_checks_are_the_simulators_rules_on_random_wgmma_operands_and_fragments():
    from pnex_magic.checking import tc_overloads as G

    rng = np.random.default_rng(13)
    buffer = _aligned_buffer(1 << 17)
    seen = set()
    for _ in range(300):
        planes, rows = int(rng.integers(1, 3)), int(rng.choice([8, 16, 60, 64, 68, 72]))
        cols = int(rng.choice([32, 64, 64, 64]))
        offset = int(rng.choice([0, 0, 128, 512, 1024]))
        x = buffer[offset:offset + planes * rows * cols * 2].view(np.float16).reshape(planes, rows, cols)
        idx = (int(rng.integers(0, planes + 1)), int(rng.choice([0, 4, 8, 16, rows - 8, rows])),
               int(rng.choice([0, 8, 16, 48, 64])))
        n = int(rng.choice([8, 16, 64]))
        gpu = _gpu_form(G._tile("x", "idx", 3, n, "site"), "x, idx")
        want = rules.wgmma_tile(x, idx, n, "w")
        assert gpu(x, idx) == _expected(want), (x.shape, offset, idx, n)
        seen.add(None if want is None else want.code)
    assert seen == {None, rules.BOUNDS, rules.RANGE, rules.ALIGN, rules.MULTIPLE, rules.ROWS}
    for length in range(1, 7):
        for exact in (True, False):
            body = G._fragment("f", 4, exact, "site").replace("    if ok and", "        if ok and", 1)
            body = body.replace("\n        _record", "\n            _record").replace("\n        ok = False",
                                                                                      "\n            ok = False")
            gpu = _gpu_form(body, "f")
            assert gpu(np.zeros(length, np.float32)) == _expected(rules.fragment(np.zeros(length), 4, exact, "w"))
