"""The CUDA simulator computes with Numba-CUDA's types (issue 34).

numba-cuda's simulator ran a kernel's Python source on NumPy scalars, whose rules
(NumPy 2's NEP 50) are not Numba's: ``float32 * 0.1`` stayed float32, ``int32 +
3000000000`` failed, ``math.sqrt`` of a float32 was a Python float.  pnex now
rewrites the kernel (:mod:`pnex_magic.simtyping`) so that every intermediate has
Numba's type.  Here: the issue's four examples and its gradcheck case through pnex
ops, then each rule on its own (literals, scalars as declared, promotions, joins,
integer wrap-around, floor division, ``math.*``, float16, bfloat16, loop indices,
thread indices, tuples, local, shared and atomic arrays, conversions, pruned
branches), each against an independent reference written with explicit NumPy
types; the errors; and the check against Numba's own typing, with a mutation that
it catches.  The random kernels are in ``tests/test_simulator_random.py``.
"""

import math  # (no `from __future__ import annotations`: kernels below annotate with local names)
from fractions import Fraction

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import KernelLaunchError, KernelTypingError

F32, F64 = np.float32, np.float64


# ----------------------------------------------------------------------------- the issue's examples


def test_issue_accumulating_float32_times_a_literal_in_float64():
    @pnex.jit(n_threads=1)
    def acc_kernel(a: pnex.In("f32", (None,)), r: pnex.Out("f64", (1,))):
        acc = 0.0
        for k in range(a.shape[0]):
            acc += a[k] * 0.1
        r[0] = acc

    a = torch.full((20000,), 1.1)
    expected = 0.0
    for x in a.numpy():
        expected = expected + float(F64(x) * 0.1)  # Numba: float32 * float64 -> float64, summed in float64
    assert acc_kernel(a).item() == expected
    assert abs(expected - 2200.0000477) < 1e-6  # the GPU's figure in the issue


def test_issue_sqrt_of_float64_times_a_float_scalar_stays_float64():
    @pnex.jit(n_threads="a.numel()")
    def sqrt_kernel(a: pnex.In("f64", (None,)), s: float, r: pnex.Out("f64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = math.sqrt(a[i]) * s

    a = torch.rand(64, dtype=torch.float64) + 0.5
    s = 1.0 / 3.0  # `float` is float32 in pnex: the kernel gets float32(1/3)
    expected = np.sqrt(a.numpy()) * F64(F32(s))
    np.testing.assert_array_equal(sqrt_kernel(a, s).numpy(), expected)


def test_issue_int32_times_int_literal_is_int64():
    @pnex.jit(n_threads="a.numel()")
    def int_kernel(a: pnex.In("i32", (None,)), r: pnex.Out("i64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = a[i] * 100000 + 3000000000

    a = torch.tensor([100000, -(2**31), 2**31 - 1, 7], dtype=torch.int32)
    expected = a.numpy().astype(np.int64) * 100000 + 3000000000
    np.testing.assert_array_equal(int_kernel(a).numpy(), expected)
    assert int_kernel(a)[0].item() == 13_000_000_000


def test_issue_float32_divided_by_a_literal_summed_in_float64():
    @pnex.jit(n_threads="a.numel()")
    def div_kernel(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            t = 0.0
            for k in range(1000):
                t += a[i] / 3.0
            r[i] = t

    a = torch.tensor([1.0, 0.1, -7.25])
    expected = []
    for x in a.numpy():
        t = 0.0
        for _ in range(1000):
            t = t + float(F64(x) / 3.0)
        expected.append(F32(t))
    np.testing.assert_array_equal(div_kernel(a).numpy(), np.array(expected))
    assert div_kernel(a)[0].item() == float(F32(333.33334))


def test_issue_derived_backward_with_a_branch_and_a_float_scalar_passes_gradcheck_on_cpu():
    @pnex.jit(n_threads="x.numel()", backward="auto")
    def branchy(x: pnex.In("f64", (None,)), s: float, y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            if x[i] > 1.0:
                y[i] = math.sqrt(x[i]) * s + 0.5 * x[i]
            else:
                y[i] = x[i] * x[i] * s

    x = (torch.rand(16, dtype=torch.float64) * 3).requires_grad_()
    x.data[(x.data - 1.0).abs() < 0.05] += 0.2  # away from the branch's edge
    assert torch.autograd.gradcheck(lambda t: branchy(t, 0.6187), (x,))


# ----------------------------------------------------------------------------- each rule


def run(fn, sig: tuple, grid: int, block: int, *args):
    """``fn`` typed for Numba types ``sig`` and run in the CUDA simulator, as pnex runs a
    kernel on CPU tensors (scalars as NumPy scalars of their types); arrays in place."""
    import warnings

    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    from pnex_magic.simtyping import typed_kernel
    from pnex_magic.snapshot import freeze, simulable

    typed = typed_kernel(freeze(fn).function, sig, fn.__name__)
    wrapped = [FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) encountered", RuntimeWarning)
        FakeCUDAKernel(simulable(typed, fn.__name__), device=False)[grid, block](*wrapped)


def sig_of(*names: str) -> tuple:
    """Numba types by short names: ``"f32[]"`` an array, ``"i32"`` a scalar."""
    from numba.cuda import types as t

    out = []
    for name in names:
        base = getattr(t, {"f16": "float16", "f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64",
                           "u32": "uint32", "b": "boolean", "bf16": "bfloat16"}[name.rstrip("[]")])
        out.append(t.Array(base, 1, "A") if name.endswith("[]") else base)
    return tuple(out)


def k_int_literal_compare(a, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = 16777217 > a[i]  # Numba: int64 vs float32 compares in float64


def test_a_comparison_of_an_int_literal_and_a_float32_is_in_float64():
    a, r = np.array([16777216.0, 16777218.0], F32), np.zeros(2, np.bool_)
    run(k_int_literal_compare, sig_of("f32[]", "b[]"), 1, 2, a, r)
    np.testing.assert_array_equal(r, [True, False])  # NumPy's weak int -> float32 would say False, False


def k_bools(a, b, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = (a[i] > 0) + (b[i] > 0)


def test_the_sum_of_two_bools_is_an_int64():
    a, b, r = np.array([1.0, 1.0, -1.0], F32), np.array([1.0, -1.0, -1.0], F32), np.zeros(3, np.int64)
    run(k_bools, sig_of("f32[]", "f32[]", "i64[]"), 1, 3, a, b, r)
    np.testing.assert_array_equal(r, [2, 1, 0])  # NumPy: True + True is True (1)


def k_int_mix(c, u, s, r, ru):
    i = cuda.grid(1)
    if i < c.shape[0]:
        r[i] = c[i] + c[i] + s * s  # int32 + int32 -> int64; an int32 scalar squared -> int64
        ru[i] = u[i] * u[i]  # uint32 * uint32 -> uint64, stored into uint32: wraps


def test_integer_promotion_to_64_bits_and_wraparound_on_store():
    c = np.array([2**31 - 1, -(2**31)], np.int32)
    u = np.array([2**31, 3], np.uint32)
    r, ru = np.zeros(2, np.int64), np.zeros(2, np.uint32)
    run(k_int_mix, sig_of("i32[]", "u32[]", "i32", "i64[]", "u32[]"), 1, 2, c, u, np.int32(2**31 - 1), r, ru)
    np.testing.assert_array_equal(r, c.astype(np.int64) * 2 + (2**31 - 1) ** 2)
    np.testing.assert_array_equal(ru, [0, 9])


def k_floordiv(a, b, q, m):
    i = cuda.grid(1)
    if i < a.shape[0]:
        q[i] = a[i] // b[i]
        m[i] = a[i] % b[i]


def test_floor_division_and_modulo_of_negative_integers_and_by_zero():
    a = np.array([-7, 7, -7, 7, 5, -(2**63)], np.int64)
    b = np.array([2, -2, -2, 0, 0, -1], np.int64)
    q, m = np.zeros(6, np.int64), np.zeros(6, np.int64)
    run(k_floordiv, sig_of("i64[]", "i64[]", "i64[]", "i64[]"), 1, 6, a, b, q, m)
    # Python's floor semantics; a zero divisor gives 0 (Numba's numpy error model), and so does MIN // -1
    np.testing.assert_array_equal(q, [-4, -4, 3, 0, 0, 0])
    np.testing.assert_array_equal(m, [1, -1, -1, 0, 0, 0])


def k_float_mod(a, b, r, q):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i] % b[i]
        q[i] = a[i] // b[i]


def _gpu_frem(x: float, y: float) -> float:
    """The remainder NVVM computes for LLVM's ``frem`` (its PTX for ``a % b``):
    ``|x| - floor(|x| / |y|) * |y|`` with ``x``'s sign, each operation rounded."""
    ax, ay = abs(F64(x)), abs(F64(y))
    t = ax - np.floor(ax / ay) * ay
    return -t if x < 0 else t


def test_float_modulo_is_pythons_rule_over_the_gpus_remainder():
    a = np.array([-7.5, 7.5, 1e17, -1e17, 5.0, 3.0], F64)
    b = np.array([2.0, -2.0, 3.0, 3.0, 0.0, -0.0], F64)
    r, q = np.zeros(6, F64), np.zeros(6, F64)
    run(k_float_mod, sig_of("f64[]", "f64[]", "f64[]", "f64[]"), 1, 6, a, b, r, q)
    assert list(r[:2]) == [0.5, -0.5] and list(q[:2]) == [-4.0, -4.0]
    for k in (2, 3):  # a quotient beyond 2**53: the GPU's remainder, not C's exact fmod
        m = _gpu_frem(a[k], b[k])
        if m != 0 and (b[k] < 0) != (m < 0):
            m = b[k] + m
        assert r[k] == m
    assert np.isnan(r[4]) and q[4] == np.inf  # by zero: NaN and x / 0
    assert np.isnan(r[5]) and q[5] == -np.inf


def k_math_f32(a, r, e):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = math.sqrt(a[i])  # float32 in Numba: rounded to float32 before the float64 store
        e[i] = math.exp(a[i]) * 1.0  # float32 exp, then float32 * float64


def test_math_of_a_float32_is_a_float32():
    a = np.array([2.0, 3.0, 0.1, 10.5], F32)
    r, e = np.zeros(4, F64), np.zeros(4, F64)
    run(k_math_f32, sig_of("f32[]", "f64[]", "f64[]"), 1, 4, a, r, e)
    np.testing.assert_array_equal(r, np.sqrt(a).astype(F64))
    np.testing.assert_array_equal(e, np.array([F32(math.exp(float(x))) for x in a]).astype(F64))


def k_half(h, r, w):
    i = cuda.grid(1)
    if i < h.shape[0]:
        r[i] = h[i] * h[i] + h[i]  # float16 arithmetic, each operation rounded to float16
        w[i] = h[i] * 2.0  # float16 * float64 -> float64


def test_float16_arithmetic_rounds_each_operation_to_float16():
    h = np.array([1.0009765625, 300.5, -0.0999755859375, 65504.0], np.float16)
    r, w = np.zeros(4, np.float16), np.zeros(4, F64)
    run(k_half, sig_of("f16[]", "f16[]", "f64[]"), 1, 4, h, r, w)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(r, (h * h) + h)  # NumPy's float16 ops: each rounded to float16
    np.testing.assert_array_equal(w, h.astype(F64) * 2.0)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_precision_through_pnex_ops_matches_torch(dtype):
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16

    @pnex.jit(n_threads="x.numel()")
    def half_ops(x: pnex.In(dtype, (None,)), y: pnex.In(dtype, "x"), s: pnex.Scalar(dtype),
                 p: pnex.Out(dtype, "x"), q: pnex.Out(dtype, "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            p[i] = x[i] * y[i] + s  # half ops, each rounded
            q[i] = x[i] * 0.1  # half * float64 -> float64, rounded once into the half output

    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(64, generator=g) * 10).to(tdt), (torch.randn(64, generator=g) * 10).to(tdt)
    s = 1.3
    p, q = half_ops(x, y, s)
    s_half = torch.tensor(s).to(tdt)
    torch.testing.assert_close(p, (x * y) + s_half, rtol=0, atol=0)  # torch rounds each half op too
    bits, low = (8, -126) if dtype == "bf16" else (11, -14)
    expected = [_round_to(float(v) * 0.1, bits, low) for v in x.double()]
    assert q.double().tolist() == expected


def _round_to(value: float, bits: int, low_exponent: int) -> float:
    """``value`` rounded once, to nearest even, to ``bits`` significant bits (subnormal
    below 2**low_exponent): an exact reference for float16 and bfloat16."""
    if value == 0 or not math.isfinite(value):
        return value
    exact = Fraction(value)
    e = max(math.frexp(value)[1] - 1, low_exponent)  # 2**e <= |value| < 2**(e + 1)
    step = Fraction(2) ** (e - bits + 1)
    n, rest = divmod(exact, step)
    if rest * 2 > step or (rest * 2 == step and n % 2 == 1):
        n += 1
    return float(n * step)


def k_thread_index(r):
    i = cuda.grid(1)
    r[i] = cuda.threadIdx.x * 2147483647  # int32 * int64 literal: int64, no int32 overflow


def test_thread_indices_are_int32_and_their_products_int64():
    r = np.zeros(4, np.int64)
    run(k_thread_index, sig_of("i64[]"), 1, 4, r)
    np.testing.assert_array_equal(r, np.arange(4, dtype=np.int64) * 2147483647)


def k_tuple_local_shared(a, b, r, s):
    i = cuda.grid(1)
    tile = cuda.shared.array(4, np.float32)
    local = cuda.local.array(1, np.float32)
    if i < a.shape[0]:
        t = (a[i], 2.5)
        local[0] = b[i] * 0.1  # a float64 stored into a float32 array: rounded once
        tile[i] = b[i] * 0.1
        cuda.syncthreads()
        r[i] = t[0] * t[1]  # float32 * float64 -> float64
        s[i] = local[0] + tile[i]  # float32 + float32 -> float32


def test_tuples_local_and_shared_arrays_keep_their_types():
    a, b = np.array([0.1, 3.3, -2.2, 7.0], F32), np.array([0.3, 1.7, 2.9, -0.4], F64)
    r, s = np.zeros(4, F64), np.zeros(4, F64)
    run(k_tuple_local_shared, sig_of("f32[]", "f64[]", "f64[]", "f64[]"), 1, 4, a, b, r, s)
    np.testing.assert_array_equal(r, a.astype(F64) * 2.5)
    np.testing.assert_array_equal(s, (F32(1) * (b * 0.1).astype(F32) * 2).astype(F64))


def k_atomic(acc, olds):
    i = cuda.grid(1)
    olds[i] = cuda.atomic.add(acc, 0, 0.1)  # 0.1 converted to float32 before the add


def test_atomic_add_converts_the_value_to_the_array_type_and_returns_it():
    acc, olds = np.zeros(1, F32), np.zeros(8, F64)
    run(k_atomic, sig_of("f32[]", "f64[]"), 1, 8, acc, olds)
    expected = F32(0)
    seen = []
    for _ in range(8):
        seen.append(expected)
        expected = F32(expected + F32(0.1))
    assert acc[0] == expected
    assert sorted(olds) == sorted(float(v) for v in seen)


def k_fma(a, b, c, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = cuda.fma(a[i], b[i], c[i])


def test_cuda_fma_rounds_once():
    rng = np.random.default_rng(5)
    a, b, c = (rng.uniform(-2, 2, 32).astype(F32) for _ in range(3))
    r = np.zeros(32, F32)
    run(k_fma, sig_of("f32[]", "f32[]", "f32[]", "f32[]"), 1, 32, a, b, c, r)
    for k in range(32):
        exact = Fraction(float(a[k])) * Fraction(float(b[k])) + Fraction(float(c[k]))
        below, above = np.nextafter(r[k], F32(-np.inf)), np.nextafter(r[k], F32(np.inf))
        assert abs(Fraction(float(r[k])) - exact) <= abs(Fraction(float(below)) - exact)
        assert abs(Fraction(float(r[k])) - exact) <= abs(Fraction(float(above)) - exact)
    assert any(r[k] != F32(a[k] * b[k] + c[k]) for k in range(32))  # two roundings differ somewhere


def k_convert(b, r64, r32, h):
    i = cuda.grid(1)
    if i < b.shape[0]:
        r64[i] = int(b[i])
        r32[i] = b[i]
        h[i] = b[i]


def test_float_to_integer_saturates_and_nan_is_zero_as_ptx_cvt():
    b = np.array([3e19, -3e19, np.nan, 2.7, -2.7, 65520.0], F64)
    r64, r32, h = np.zeros(6, np.int64), np.zeros(6, np.int32), np.zeros(6, np.float16)
    run(k_convert, sig_of("f64[]", "i64[]", "i32[]", "f16[]"), 1, 6, b, r64, r32, h)
    np.testing.assert_array_equal(r64, [2**63 - 1, -(2**63), 0, 2, -2, 65520])
    np.testing.assert_array_equal(r32, [2**31 - 1, -(2**31), 0, 2, -2, 65520])
    np.testing.assert_array_equal(h[3:5], b[3:5].astype(np.float16))
    assert h[5] == np.inf  # 65520 rounds up past float16's largest finite


DEBUG = False


def k_pruned_and_joined(a, pruned, joined, loop):
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = 0
        if DEBUG:  # Numba prunes it: x stays an int
            x = 1.5
        pruned[i] = x + 9007199254740993
        y = 0
        if a[i] > 100.0:  # never true here, but typed: y is a float64 after the if
            y = 0.5
        joined[i] = y + 9007199254740993
        acc = 0
        for k in range(3):
            acc += a[i]  # int64 + float32: float64 from the first iteration on
        loop[i] = acc


def test_pruned_branches_are_not_typed_and_joins_unify():
    a = np.array([0.1, 1.0], F32)
    pruned, joined, loop = np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, F64)
    run(k_pruned_and_joined, sig_of("f32[]", "i64[]", "i64[]", "f64[]"), 1, 2, a, pruned, joined, loop)
    np.testing.assert_array_equal(pruned, [2**53 + 1] * 2)  # int64 arithmetic: exact
    np.testing.assert_array_equal(joined, [2**53] * 2)  # float64 arithmetic: 2**53 + 1 rounds to 2**53
    np.testing.assert_array_equal(loop, [F64(x) + F64(x) + F64(x) for x in a])


@cuda.jit(device=True)
def scaled(x):
    return x * 0.1


def k_device(a, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = scaled(a[i])  # scaled(float32) returns a float64


def test_a_device_function_is_typed_for_its_arguments():
    a, r = np.array([0.1, 3.0], F32), np.zeros(2, F64)
    run(k_device, sig_of("f32[]", "f64[]"), 1, 2, a, r)
    np.testing.assert_array_equal(r, a.astype(F64) * 0.1)


def k_minmax_round_pow(a, c, mx, rd, p, ip):
    i = cuda.grid(1)
    if i < a.shape[0]:
        mx[i] = max(a[i], 1)  # float32 and int64: float64; Python's rule for NaN (first kept)
        rd[i] = round(a[i])  # half to even, an int64
        p[i] = a[i] ** 3  # square-and-multiply in float32, not powf
        ip[i] = c[i] ** -1  # 0 but for 1 and -1; 0 ** -1 is the lowest int64


def test_min_max_round_and_integer_powers_as_numba():
    a = np.array([np.nan, 2.5, -0.5, 1.1], F32)
    c = np.array([2, 1, -1, 0], np.int64)
    mx, rd, p, ip = np.zeros(4, F64), np.zeros(4, np.int64), np.zeros(4, F32), np.zeros(4, np.int64)
    run(k_minmax_round_pow, sig_of("f32[]", "i64[]", "f64[]", "i64[]", "f32[]", "i64[]"), 1, 4, a, c, mx, rd, p, ip)
    assert np.isnan(mx[0]) and list(mx[1:]) == [2.5, 1.0, float(F32(1.1))]
    np.testing.assert_array_equal(rd[1:], [2, 0, 1])
    np.testing.assert_array_equal(p, [np.nan if np.isnan(x) else x * (x * x) for x in a])
    np.testing.assert_array_equal(ip, [0, 1, -1, -(2**63)])


def test_scalars_are_passed_as_their_declared_types():
    @pnex.jit(n_threads="x.numel()")
    def scalars(x: pnex.In("f32", (None,)), n: pnex.Scalar("i32"), f: float, d: pnex.Scalar("f64"),
                r: pnex.Out("i64", "x"), s: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            r[i] = n * n  # int32 * int32 -> int64
            s[i] = f + d  # float32 + float64 -> float64

    r, s = scalars(torch.zeros(2), 2**31 - 1, 0.1, 0.2)
    assert r.tolist() == [(2**31 - 1) ** 2] * 2
    assert s.tolist() == [float(F64(F32(0.1)) + 0.2)] * 2


# ----------------------------------------------------------------------------- errors and the cross-check


def test_a_kernel_numba_cannot_type_fails_on_cpu_naming_the_line():
    def untypable(x: pnex.In("f32", (None,)), r: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            r[i] = x[i] + "one"

    line = untypable.__code__.co_firstlineno + 3
    with pytest.raises(KernelTypingError, match=rf"line {line}"):  # at definition where NVVM compiles, else at the call
        pnex.jit(n_threads="x.numel()")(untypable)(torch.zeros(2))
    with pytest.raises(KernelTypingError, match=rf"line {line}"):  # the simulator's own typing says the same
        run(untypable, sig_of("f32[]", "f32[]"), 1, 1, np.zeros(1, F32), np.zeros(1, F32))


def test_what_the_simulator_cannot_compute_as_numba_is_an_error_naming_the_line():
    def complexity(a, r):
        i = cuda.grid(1)
        if i < a.shape[0]:
            z = a[i] + 1j
            r[i] = z.real

    with pytest.raises(KernelLaunchError, match=r"line \d+: `z = a\[i\] \+ 1j`.*cannot compute this as Numba-CUDA"):
        run(complexity, sig_of("f32[]", "f64[]"), 1, 1, np.zeros(1, F32), np.zeros(1, F64))


def k_join(a, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = 0
        if a[i] > 0:
            x = 0.5
        r[i] = x


def test_the_cross_check_against_numbas_typing_catches_a_wrong_type(monkeypatch):
    from pnex_magic.simtyping import numba_types

    unify = numba_types.unify
    wrong = lambda *tys: numba_types.nb().float32 if len(tys) > 1 else unify(*tys)  # noqa: E731 - the mutation
    monkeypatch.setattr(numba_types, "unify", wrong)  # joins unified to float32: not Numba's float64
    with pytest.raises(KernelLaunchError, match=r"typing of the variable 'x' .* is not Numba-CUDA's"):
        run(k_join, sig_of("f32[]", "f64[]"), 1, 1, np.ones(1, F32), np.zeros(1, F64))
    monkeypatch.undo()
    r = np.zeros(1, F64)
    run(k_join, sig_of("f32[]", "f64[]"), 1, 1, np.ones(1, F32), r)
    assert r[0] == 0.5


def test_range_and_grid_indices_have_numbas_types():
    from numba.cuda import types as t

    from pnex_magic.simtyping.kernel import Build, param_val
    from pnex_magic.snapshot import freeze

    def loops(a, n):
        i = cuda.grid(1)
        for k in range(n):
            a[i] = k
        for j in range(a.shape[0]):
            a[j] = j

    build = Build("loops")
    _, walker, _ = build.function(freeze(loops).function, [param_val(t.float32[:]), param_val(t.int32)],
                                  "the kernel", returns=False)
    assert walker.assigned["k"] == {t.int32}  # range of an int32: int32 indices
    assert walker.assigned["j"] == {t.int64}
    assert walker.assigned["i"] == {t.int64}



def test_a_constant_tuple_shape_and_a_loop_over_literal_unroll_as_numba_types_them():
    """A folded constant tuple is a tuple of literals to Numba (``cuda.shared.array((4, 8),
    ...)`` needs them, ``alignment=`` too, as tensor-core kernels write it); the target of
    ``for j in literal_unroll(tuple)`` is one literal per copy of the body, which the
    check against Numba's typing takes as the integer it holds."""
    from numba.cuda.misc.special import literal_unroll

    columns = (0, 1, 2)

    @pnex.jit(n_threads=8, threads_per_block=8)
    def tiles(a: pnex.In("f32", (4, 8)), r: pnex.Out("f32", (8,))):
        s = cuda.shared.array((4, 8), np.float32, alignment=128)
        t = cuda.threadIdx.x
        for row in range(4):
            s[row, t] = a[row, t]
        cuda.syncthreads()
        acc = 0.0
        for j in literal_unroll(columns):
            acc += s[j, t] * 0.5
        r[t] = acc

    a = torch.rand(4, 8)
    expected = np.zeros(8, F64)
    for j in columns:
        expected += a[j].numpy().astype(F64) * 0.5  # float32 * float64 literal: float64, summed in float64
    np.testing.assert_array_equal(tiles(a).numpy(), expected.astype(F32))
