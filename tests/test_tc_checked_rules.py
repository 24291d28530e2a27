"""Bad inputs to the tensor-core primitives (pnex.tc), without a GPU: each gets one clear
error, never a wrong result.  This file: the rules (:mod:`pnex_magic.tc.rules`) on NumPy arrays,
with their boundaries (an off-by-one in a span, an alignment, a fragment's length must be caught),
the checked variant's rewrite, and the GPU checks, which are the simulator's rules on random
spans, operands and fragments.

tests/test_tc_checked_gpu.py runs the same kernels checked on a GPU.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

import pnex_magic as pnex
from pnex_magic import checking as C
from pnex_magic import tc
from pnex_magic.tc import arrays, rules

sys.path.insert(0, str(Path(__file__).parent))
import tc_bad_kernels as B  # noqa: E402

from tc_checked_helpers import F16


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
