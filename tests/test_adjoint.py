"""Derived backward kernels (issue 28, pnex_magic.adjoint) on CPU tensors: the CUDA
simulator runs them, and every kernel is compiled for the GPU too (its generated source
must type in Numba).

The four kernels of the issue (benchmarks/derived_kernels.py) pass ``gradcheck`` in float64
and match PyTorch's autograd on fresh inputs with poisoned outputs (every gradient
element the backward does not write would be NaN); plain stores are used where the
source proves each element the thread's own, atomics elsewhere; ``opcheck`` and
``torch.compile`` see the derived backward as a hand-written one; what the transform
does not differentiate exactly is refused, naming the line.  The randomised and mutation
checks are in tests/test_adjoint_random.py.
"""

from __future__ import annotations

import math
import re

import sys
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import KernelDefinitionError, cache
from pnex_magic import op as op_module
from pnex_magic.adjoint import derive_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import derived_kernels as ak  # noqa: E402 - benchmarks/derived_kernels.py

F64 = torch.float64


def rand(*shape, dtype=F64, low=None):
    g = torch.Generator()
    g.seed()  # fresh inputs every run
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    if low is not None:
        t = t.abs() + low
    return t.to(dtype).requires_grad_()


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs without ``init`` start as NaN (not whatever torch.empty gives): an element a
    kernel does not write shows."""
    allocate = op_module._allocate

    def poison(spec, env, device, fake):
        outs = allocate(spec, env, device, fake)
        if not fake:
            for p, t in zip(spec.outputs, outs):
                if p.init is None and t.dtype.is_floating_point:
                    t.fill_(float("nan"))
        return outs

    monkeypatch.setattr(op_module, "_allocate", poison)


K = ak.kernels(F64)

CASES = {
    "elementwise": (lambda: (rand(23), rand(23)), lambda x, w: K.elementwise(x, w, 0.375),
                    lambda x, w: ak.elementwise_reference(x, w, 0.375)),
    "stencil": (lambda: (rand(6, 7),), lambda u: K.stencil(u, 0.25), lambda u: ak.stencil_reference(u, 0.25)),
    "rowsq": (lambda: (rand(5, 4), rand(4)), K.rowsq, ak.rowsq_reference),
    "lltm": (lambda: (rand(3, 12), rand(3, 4)), K.lltm, ak.lltm_reference),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck_in_float64(case):
    make, op, _ = CASES[case]
    assert torch.autograd.gradcheck(op, make())


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_pytorch_with_poisoned_outputs(case, poisoned):
    make, op, reference = CASES[case]
    inputs = make()
    mine = inputs
    theirs = [t.detach().clone().requires_grad_() for t in inputs]
    outs, refs = op(*mine), reference(*theirs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = refs if isinstance(refs, tuple) else (refs,)
    weights = [torch.randn_like(r) for r in refs]
    sum(((o * w).sum() for o, w in zip(outs, weights)), torch.zeros((), dtype=F64)).backward()
    sum(((r * w).sum() for r, w in zip(refs, weights)), torch.zeros((), dtype=F64)).backward()
    for a, b in zip(mine, theirs):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_the_derived_backward_agrees_with_the_hand_written_one(poisoned):
    hand = ak.hand_written(F64, threads=32)
    x, w = rand(25), rand(25)
    gy, gz = torch.randn(25, dtype=F64), torch.randn(25, dtype=F64)
    y, z = K.elementwise(x, w, 0.375)
    torch.autograd.backward((y, z), (gy, gz))
    gx, gw = hand.elementwise(x.detach(), w.detach(), 0.375, gy, gz)
    torch.testing.assert_close(x.grad, gx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, gw, rtol=1e-12, atol=1e-12)
    a, b, g = rand(11), rand(11), torch.randn(11, dtype=F64)
    K.muladd(a, b, 0.5).backward(g)
    ga, gb = hand.muladd(g, a.detach(), b.detach())
    assert torch.equal(a.grad, ga) and torch.equal(b.grad, gb)


def pnex_registered(derived):
    from pnex_magic.define import registered

    return registered(derived.definition(K.stencil.definition.options))


def _plans(op):
    derived = derive_kernel(op.definition.fn, op.spec)
    return {p.tensor: p.mode for p in derived.plans}, derived.source


def test_plain_stores_where_each_element_is_the_threads_own_atomics_where_threads_share():
    plans, source = _plans(K.elementwise)
    assert plans == {"x": "store", "w": "store"} and "atomic" not in source
    plans, source = _plans(K.lltm)
    assert plans == {"gates": "store", "old_cell": "store"} and "atomic" not in source
    assert "grad_gates: pnex.Out('float64', 'gates')," in source  # no init: no memset
    plans, source = _plans(K.stencil)  # neighbours read each element: each thread gathers theirs
    assert plans == {"u": "gather"} and "atomic" not in source
    assert "grad_u: pnex.Out('float64', 'u')," in source
    assert source.count("# as the thread at ") == 4  # (i + 1, j), (i - 1, j), (i, j + 1), (i, j - 1)
    plans, source = _plans(K.rowsq)  # x[row, k] is the row's own; every row reads w[k]
    assert plans == {"x": "store", "w": "atomic"}


def test_a_read_at_an_offset_is_never_a_plain_store(poisoned):
    """``x[i + 1]`` is another thread's element (found by the randomised check: it once
    passed for ``c * S + i`` with an unknown size)."""
    def k_shifted(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            if i + 1 < x.shape[0]:
                y[i] = x[i] * x[i + 1]
            else:
                y[i] = x[i]

    op = pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_shifted)
    assert "grad_x[i + 1] =" not in op.backward_source
    assert torch.autograd.gradcheck(op, (rand(9),))


@pnex.jit(n_threads="u.numel()", backward="auto")
def periodic_neighbour(u: pnex.In("f64", (None,)), out: pnex.Out("f64", "u")):
    i = cuda.grid(1)
    if i < u.shape[0]:
        out[i] = u[i - 1] * 2.0 + u[i] * u[i]  # at i = 0, u[-1] is the last element (Numba wraps it)


def test_a_read_that_wraps_around_gets_its_gradient(poisoned):
    """``u[i - 1]`` with no guard that keeps ``i - 1`` non-negative reads the last element
    in thread 0, as Numba wraps negative indices: the gather would miss that element's
    share (no thread at i = n gathers it), so the source must prove a gather's every read
    in bounds, and this one is written with atomics (which wrap as the forward does)."""
    plans, _ = _plans(periodic_neighbour)
    assert plans == {"u": "atomic"}
    u = rand(9)
    g = rand(9).detach()
    periodic_neighbour(u).backward(g)
    u2 = u.detach().clone().requires_grad_()
    (torch.roll(u2, 1) * 2 + u2 * u2).backward(g)
    torch.testing.assert_close(u.grad, u2.grad)


def test_atomics_where_the_gather_does_not_apply(poisoned):
    """The stencil's gradient with atomics (the proofs switched off) is the gathered one."""
    derived = derive_kernel(K.stencil.definition.fn, K.stencil.spec, atomic_only=True)
    assert [p.mode for p in derived.plans] == ["atomic"] and derived.source.count("atomic.add") == 6
    with pnex_registered(derived) as atomic:
        u, g = rand(6, 7).detach(), torch.randn(6, 7, dtype=F64)
        gathered = pnex.autograd.attached_backward(K.stencil).backward(u, 0.25, g)
        torch.testing.assert_close(atomic(u, 0.25, g), gathered, rtol=1e-12, atol=1e-12)


def test_lltm_columns_no_thread_reads_get_zero_gradients(poisoned):
    """gates has 3 * S + 2 columns: the forward reads the first 3 * S; the backward's
    threads write zeros in the rest (a stride loop), with no memset."""
    gates, cell = rand(3, 14), rand(3, 4)
    new_h, new_cell = K.lltm(gates, cell)
    (new_h.sum() + 2 * new_cell.sum()).backward()
    assert torch.equal(gates.grad[:, 12:], torch.zeros(3, 2, dtype=F64))
    g2, c2 = gates.detach().clone().requires_grad_(), cell.detach().clone().requires_grad_()
    h2, n2 = ak.lltm_reference(g2[:, :12], c2)
    (h2.sum() + 2 * n2.sum()).backward()
    torch.testing.assert_close(gates.grad[:, :12], g2.grad[:, :12])
    torch.testing.assert_close(cell.grad, c2.grad)


def test_opcheck_sees_the_derived_backward():
    x, w = rand(9), rand(9)
    torch.library.opcheck(K.elementwise, (x, w, 0.5))
    torch.library.opcheck(K.lltm, (rand(2, 9), rand(2, 3)))
    bwd = pnex.autograd.attached_backward(K.stencil).backward
    torch.library.opcheck(bwd, (rand(4, 5, ).detach(), 0.25, rand(4, 5).detach()))


def test_torch_compile_traces_the_backward_graph():
    x, w = rand(3, 5), rand(5)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(x, w):
        return (K.rowsq(x, w) ** 2).sum()

    loss(x, w).backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (ak.rowsq_reference(x2, w2) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_types_accumulate_in_float32(dtype, tol):
    """float16/bfloat16 values are promoted to float32 in the backward; a gradient written
    with atomics (rowsq's ``w``) is accumulated in float32 and cast back by autograd."""
    k = ak.kernels(dtype)
    plans = derive_kernel(k.rowsq.definition.fn, k.rowsq.spec).plans
    assert [(p.mode, p.dtype) for p in plans] == [("store", dtype_name(dtype)), ("atomic", "float32")]
    for op, reference, inputs, extra in (
        (k.elementwise, ak.elementwise_reference, (rand(21, dtype=dtype), rand(21, dtype=dtype)), (0.375,)),
        (k.stencil, ak.stencil_reference, (rand(5, 6, dtype=dtype),), (0.25,)),
        (k.rowsq, ak.rowsq_reference, (rand(4, 5, dtype=dtype), rand(5, dtype=dtype)), ()),
    ):
        outs = op(*inputs, *extra)
        outs = outs if isinstance(outs, tuple) else (outs,)
        weights = [torch.randn(o.shape, dtype=F64).to(dtype) for o in outs]
        sum((o * w).float().sum() for o, w in zip(outs, weights)).backward()
        ref_in = [t.detach().double().requires_grad_() for t in inputs]
        refs = reference(*ref_in, *extra)
        refs = refs if isinstance(refs, tuple) else (refs,)
        sum((r * w.double()).sum() for r, w in zip(refs, weights)).backward()
        for a, b in zip(inputs, ref_in):
            assert a.grad.dtype == dtype
            scale = b.grad.abs().max().item()
            torch.testing.assert_close(a.grad.double(), b.grad, rtol=tol, atol=tol * scale)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ------------------------------------------------------------------------ loops
def decayed(x: pnex.In("f64", (None, None)), decay: pnex.Scalar("f64"), r: pnex.Out("f64", ("x.size(0)",))):
    row = cuda.grid(1)
    if row < x.shape[0]:
        s = 0.0
        for k in range(x.shape[1]):
            s = s * decay + math.sin(x[row, k])
        r[row] = math.tanh(s)


def running_product(x: pnex.In("f64", (None, None)), r: pnex.Out("f64", ("x.size(0)",))):
    row = cuda.grid(1)
    if row < x.shape[0]:
        p = 1.0
        for k in range(x.shape[1]):
            p = p * x[row, k]
        r[row] = p


def strided(x: pnex.In("f64", (None,)), r: pnex.Out("f64", (1,))):
    i = cuda.grid(1)
    if i == 0:
        s = 0.0
        for k in range(x.shape[0] - 1, -1, -2):
            s += x[k] * x[k] * k
        r[0] = s


def test_a_recurrence_with_a_fixed_coefficient_needs_no_tape():
    op = pnex.jit(n_threads="x.size(0)", threads_per_block=32, backward="auto")(decayed)
    assert "atomic" not in op.backward_source
    assert torch.autograd.gradcheck(lambda x: op(x, 0.7), (rand(3, 5),))


def test_a_loop_stepping_down_by_two():
    op = pnex.jit(n_threads=1, threads_per_block=32, backward="auto")(strided)
    assert torch.autograd.gradcheck(op, (rand(7),))


def test_a_nonlinear_recurrence_is_refused_naming_the_loop():
    line = running_product.__code__.co_firstlineno + 5
    with pytest.raises(KernelDefinitionError, match=rf"line {line}.*'p' as it was in each trip of the loop at line"):
        pnex.jit(n_threads="x.size(0)", threads_per_block=32, backward="auto")(running_product)


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


def test_the_derived_backward_is_cached_like_any_compile(fresh_cache):
    def k_cached(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = math.exp(x[i]) * x[i]

    op = pnex.jit(n_threads="x.numel()", threads_per_block=32)(k_cached)
    first = pnex.derive_backward(op)
    assert first.definition.compiled().cache_hit is False
    hits = cache.stats.hits
    again = pnex.derive_backward(op)
    assert again.definition.compiled().cache_hit is True and cache.stats.hits > hits
    assert again.definition.op_name == first.definition.op_name


def test_the_source_is_shown_and_the_backward_op_is_ordinary():
    source = K.lltm.backward_source
    assert source.startswith("def lltm_forward_float64_derived_adjoint(")
    assert "grad_new_h: pnex.In('float64'" in source
    bwd = pnex.autograd.attached_backward(K.lltm).backward
    assert bwd.spec.python_signature().startswith("lltm_forward_float64_derived_adjoint(gates: Tensor[float64, (None, None)]")
    report = pnex.inspect(bwd)
    assert report.ptx and ".entry" in report.ptx
    assert re.search(r"cuda\.grid\(2\)", source)


def test_jax_grad_runs_the_derived_backward():
    jax = pytest.importorskip("jax")
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    try:
        f = pnex.jax_op(K.lltm)
        gates, cell = np.random.default_rng().standard_normal((3, 12)), np.random.default_rng().standard_normal((3, 4))

        def loss(gates, cell):
            h, c = f(gates, cell)
            return (h * h).sum() + (2.0 * c).sum()

        gg, gc = jax.grad(loss, argnums=(0, 1))(gates, cell)
        tg, tc = torch.tensor(gates, requires_grad=True), torch.tensor(cell, requires_grad=True)
        h, c = ak.lltm_reference(tg, tc)
        ((h * h).sum() + (2.0 * c).sum()).backward()
        np.testing.assert_allclose(gg, tg.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gc, tc.grad.numpy(), rtol=1e-10, atol=1e-12)
    finally:
        jax.config.update("jax_enable_x64", False)


def test_a_saved_op_keeps_its_derived_backward(tmp_path):
    """pnex.save writes the derived backward with the op (its cubins: it is an ordinary op);
    a loaded op has no Python source to derive from, which derive_backward says."""
    def k_saved(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = math.log1p(math.exp(x[i]))

    op = pnex.jit(n_threads="x.numel()", threads_per_block=32, backward="auto")(k_saved)
    pnex.save(op, tmp_path / "k.pnex", archs=["sm_90"])
    loaded = pnex.load(tmp_path / "k.pnex")
    assert pnex.autograd.attached_backward(loaded).backward.definition.op_name.startswith("k_saved_adjoint_")
    with pytest.raises(KernelDefinitionError, match="from its kernel's Python source; got a pnex op loaded"):
        pnex.derive_backward(loaded)


def test_a_thread_reads_its_inputs_and_incoming_gradients_before_the_replayed_math():
    """As a hand-written backward does: the elementwise kernel's derived backward loads
    grad_y, grad_z, x and w at the top of its guarded block, before the branch and the
    math, so that a thread keeps them all in flight (and w once, not once per branch)."""
    _, source = _plans(K.elementwise)
    replay = source[source.index("# the forward pass"):source.index("# the reverse pass")].splitlines()
    reads = [n for n, line in enumerate(replay) if re.search(r"= (grad_[yz]|x|w)\[i\]$", line.strip())]
    first_math = next(n for n, line in enumerate(replay) if "math." in line or line.strip().startswith("if c_2"))
    assert {re.search(r"= (\w+)\[", replay[n]).group(1) for n in reads if n < first_math} == {"grad_y", "grad_z", "x", "w"}
    reverse = source[source.index("# the reverse pass"):]
    assert "grad_y[" not in reverse and "grad_z[" not in reverse  # read once, early


def _unused_branch(dtype: str):
    """y = 3 x, with w read only on a branch no element takes."""

    def kernel(x, w, y):
        i = cuda.grid(1)
        if i < x.shape[0]:
            if x[i] > 1e30:
                y[i] = w[i] * 2.0
            else:
                y[i] = x[i] * 3.0

    kernel.__name__ = kernel.__qualname__ = f"unused_branch_{dtype}"  # one op per dtype
    kernel.__annotations__ = {"x": pnex.In(dtype, (None,)), "w": pnex.In(dtype, "x"), "y": pnex.Out(dtype, "x")}
    return pnex.jit(n_threads="x.numel()", backward="auto")(kernel)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_gradient_nothing_flows_into_is_positive_zero(dtype, poisoned):
    """Adjoints start at -0.0, the identity of IEEE addition (so NVVM drops their first
    addition); a gradient nothing flows into is still stored as +0.0, as PyTorch's, not
    as -0.0."""
    op = _unused_branch("f64" if dtype == torch.float64 else "f32")
    x, w = rand(7, dtype=dtype), rand(7, dtype=dtype)
    g = rand(7, dtype=dtype).detach()
    op(x, w).backward(g)
    assert torch.equal(w.grad, torch.zeros(7, dtype=dtype)) and not torch.signbit(w.grad).any()
    torch.testing.assert_close(x.grad, 3 * g)


def test_an_early_read_stays_inside_the_branch_that_makes_its_index_valid(poisoned):
    """The incoming gradient of a store made only where ``i < y.shape[0]`` is read inside
    that branch: read earlier, the last thread would read past grad_y's end (the simulator
    raises IndexError)."""

    @pnex.jit(n_threads="x.numel()", backward="auto")
    def shorter(x: pnex.In("f64", (None,)), y: pnex.Out("f64", ("x.size(0) - 1",))):
        i = cuda.grid(1)
        if i < x.shape[0]:
            v = x[i] * 2.0
            if i < y.shape[0]:
                y[i] = v * v

    x = rand(9)
    (shorter(x) * torch.arange(1.0, 9.0, dtype=F64)).sum().backward()
    expected = torch.zeros(9, dtype=F64)
    expected[:8] = 8 * x.detach()[:8] * torch.arange(1.0, 9.0, dtype=F64)
    torch.testing.assert_close(x.grad, expected)


def test_a_stencils_backward_reads_every_incoming_gradient_it_needs_together_first():
    """The gather's five reads of grad_out (this thread's and its four neighbours'
    copies') are issued together before any copy's region tests, at clamped unsigned
    indices; each copy then uses its value only where its tests pass (the gradients
    themselves are checked by the gradcheck tests above)."""
    _, source = _plans(K.stencil)  # derived afresh: a test above registers an atomic variant under its name
    first_copy = source.index("# as the thread at")
    head, rest = source[:first_copy], source[first_copy:]
    reads = re.findall(r"grad_out\[[^\n]*\]", head)
    assert len(reads) == 5 and all(r.count("min(uint64(") == 2 for r in reads)  # one unsigned clamp per axis
    assert "if grad_out.size > 0:" in head
    assert "grad_out[" not in rest


def test_region_tests_are_replayed_without_branches_where_nothing_can_differ():
    """A test of comparisons over names, sizes and integer arithmetic is emitted with ``&``
    (no short circuit, no branch); one that reads memory or calls stays as written (its
    ``and`` may guard the read).  The eager form has the same value for random integers."""
    import random

    from pnex_magic.adjoint.program import eager_test

    text = "0 < i < n - 1 and 0 < j < u.shape[1] - 1"
    eager = eager_test(text)
    assert eager == "(0 < i) & (i < n - 1) & (0 < j) & (j < u.shape[1] - 1)"
    for kept in ("i < n and x[i] > 0", "i < n or j < n", "i < n", "i < n and math.isfinite(v)", "i < n and j // k < n"):
        assert eager_test(kept) == kept
    rng = random.Random(28)
    shape = type("U", (), {})
    for _ in range(2000):
        u = shape()
        u.shape = (rng.randint(-2, 9), rng.randint(-2, 9))
        env = {"i": rng.randint(-3, 10), "j": rng.randint(-3, 10), "n": rng.randint(-3, 10), "u": u}
        assert bool(eval(text, {}, env)) == bool(eval(eager, {}, env))


def test_a_backward_is_derived_after_the_package_is_reloaded(tmp_path):
    """``%reload_ext pnex_magic`` reloads the package: its ``annotations`` submodule must
    stay reachable as ``pnex_magic.annotations`` (a ``from __future__ import annotations``
    in the package rebound that name to the __future__ feature, and the derived backward's
    annotations failed with "'_Feature' object has no attribute 'In'")."""
    import subprocess

    code = (
        "import importlib, math, torch, pnex_magic\n"
        "from numba import cuda\n"
        "importlib.reload(pnex_magic)\n"
        "assert type(pnex_magic.annotations).__name__ == 'module'\n"
        "@pnex_magic.jit(n_threads='x.numel()', backward='auto')\n"
        "def reloaded_softplus(x: pnex_magic.In('f64', (None,)), y: pnex_magic.Out('f64', 'x')):\n"
        "    i = cuda.grid(1)\n"
        "    if i < x.shape[0]:\n"
        "        y[i] = math.log1p(math.exp(x[i]))\n"
        "x = torch.randn(6, dtype=torch.float64, requires_grad=True)\n"
        "reloaded_softplus(x).sum().backward()\n"
        "torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()))\n"
        "print('OK')\n"
    )
    script = tmp_path / "reloaded.py"  # a file: the derived backward reads the kernel's source
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
