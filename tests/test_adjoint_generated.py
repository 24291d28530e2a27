"""Derived backward kernels (issue 28, pnex_magic.adjoint) on CPU tensors: the derived
backward as an op and as code.  It is cached like any compile, its source is shown and its op
is ordinary; ``jax.grad`` runs it; a saved op keeps it; a thread reads its inputs and incoming
gradients before the replayed math, an early read stays inside the branch that makes its index
valid, region tests are replayed without branches; a gradient nothing flows into is +0; it is
derived after the package is reloaded.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import derived_kernels as ak  # noqa: E402 - benchmarks/derived_kernels.py

from adjoint_helpers import K, _plans, rand

F64 = torch.float64


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
