"""The JAX front end: pnex ops as JAX functions (``pnex_magic.jax_op``).

CPU tests run every call through ``jax.pure_callback`` and numba-cuda's CUDA
simulator (what the ``pnex_launch`` primitive lowers to on the CPU backend), so
sizes are tiny and blocks small; results are checked against ``jax.numpy`` on
fresh random inputs and errors against the PyTorch op's own.  This file: gradients through an
attached backward (and LLTM's against PyTorch), and the refusals.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in one process

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from numba import cuda  # noqa: E402

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import pnex_magic as pnex  # noqa: E402
from pnex_magic import KernelDefinitionError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads  # noqa: E402

from jax_kernels import cube, cube_reference, muladd, randn, x64  # noqa: F401 (fixtures: x64)


# ------------------------------------------------------------------------------- gradients


def test_grad_through_the_attached_backward(x64):
    f = pnex.jax_op(cube)
    x, w = randn(7, dtype=np.float64), randn(7, dtype=np.float64)
    check_grads(lambda x, w: f(x, w, 0.5), (x, w), order=1, modes=["rev"])
    gx, gw = jax.grad(lambda x, w: (f(x, w, -1.0) ** 2).sum(), argnums=(0, 1))(x, w)
    rx, rw = jax.grad(lambda x, w: (cube_reference(x, w, -1.0) ** 2).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, rx, rtol=1e-12)
    np.testing.assert_allclose(gw, rw, rtol=1e-12)
    batched = jax.jit(jax.vmap(jax.grad(lambda x: f(x, w, 0.0).sum())))(jnp.stack([x, 2 * x]))
    np.testing.assert_allclose(batched, jnp.stack([3 * x * x * w, 12 * x * x * w]), rtol=1e-12)


def test_lltm_gradients_match_pytorch(x64):
    ops = workloads.lltm_ops(torch.float64)
    forward = pnex.jax_op(ops.forward)
    gates, old_cell = randn(3, 12, dtype=np.float64), randn(3, 4, dtype=np.float64)

    def loss(gates, old_cell):
        h, c = forward(gates, old_cell)
        return (h * h).sum() + (c * jnp.arange(4.0)).sum()

    grads = jax.grad(loss, argnums=(0, 1))(gates, old_cell)
    tg = torch.tensor(np.asarray(gates), requires_grad=True)
    tc = torch.tensor(np.asarray(old_cell), requires_grad=True)
    h, c = ops.forward(tg, tc)
    ((h * h).sum() + (c * torch.arange(4.0, dtype=torch.float64)).sum()).backward()
    np.testing.assert_allclose(grads[0], tg.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grads[1], tc.grad.numpy(), rtol=1e-10)
    check_grads(lambda g, c: forward(g, c), (gates, old_cell), order=1, modes=["rev"])


def test_grad_without_a_backward_is_a_clear_error():
    f = pnex.jax_op(muladd)
    a = randn(2, 3)
    with pytest.raises(KernelDefinitionError, match=r"muladd\(\): JAX can only differentiate .*attach_backward"):
        jax.grad(lambda a: f(a, a, 1.0).sum())(a)


def test_pytorch_only_autograd_formulas_are_refused_by_jax():
    def sq(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i] * x[i]

    def sq_backward(grad_y: pnex.In("f32", (None,)), scale: pnex.In("f32", "grad_y"), grad_x: pnex.Out("f32", "grad_y")):
        i = cuda.grid(1)
        if i < grad_y.shape[0]:
            grad_x[i] = grad_y[i] * scale[i]

    fwd = pnex.jit(n_threads="x.numel()", threads_per_block=32)(sq)
    bwd = pnex.jit(n_threads="grad_y.numel()", threads_per_block=32)(sq_backward)
    x = randn(4)
    fwd.register_autograd(lambda ctx, g: g)
    with pytest.raises(KernelDefinitionError, match="PyTorch autograd formula"):
        jax.grad(lambda x: pnex.jax_op(fwd)(x).sum())(x)

    def setup(ctx, inputs, output):
        pnex.autograd.save_for_backward(ctx, scale=2 * inputs[0])

    pnex.attach_backward(fwd, bwd, setup_context=setup)
    np.testing.assert_allclose(pnex.jax_op(fwd)(x), x * x, rtol=1e-6)  # the primal still works
    with pytest.raises(KernelDefinitionError, match="custom setup_context"):
        jax.grad(lambda x: pnex.jax_op(fwd)(x).sum())(x)
