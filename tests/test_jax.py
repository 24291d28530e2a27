"""The JAX front end: pnex ops as JAX functions (``pnex_magic.jax_op``).

CPU tests run every call through ``jax.pure_callback`` and numba-cuda's CUDA
simulator (what the ``pnex_launch`` primitive lowers to on the CPU backend), so
sizes are tiny and blocks small; results are checked against ``jax.numpy`` on
fresh random inputs and errors against the PyTorch op's own.  This file: the API, the errors, the
magic's ``--jax``; tests marked ``gpu`` run the same kernels through XLA on a GPU.
Gradients: tests/test_jax_grad.py; the GPU branch without a GPU: tests/test_jax_ffi.py.
"""

import os
import subprocess
import sys
import textwrap
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
from pnex_magic import ArgumentShapeError, ArgumentTypeError, KernelDefinitionError  # noqa: E402
from pnex_magic.frontends.jax_op import JaxOp  # noqa: E402
from pnex_magic.launch import xla  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads  # noqa: E402

from jax_kernels import accumulate, bf16_axpy, cube, muladd, randn, repeat, rng, x64  # noqa: F401 (fixtures: x64)


# ------------------------------------------------------------------------------- the API


def test_importing_pnex_does_not_import_jax(pnex_env):
    code = "import sys, pnex_magic; from pnex_magic import *; assert 'jax' not in sys.modules; print(jax_op.__doc__[:7])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pnex_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "The JAX"
    assert "jax_op" in pnex.__all__


def test_without_jax_the_torch_op_works_and_jax_op_says_what_to_install(pnex_env):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["jax"] = None  # as if JAX were not installed
        import torch, pnex_magic as pnex
        from numba import cuda

        @pnex.jit(n_threads="a.numel()", threads_per_block=32)
        def neg(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = -a[i]

        x = torch.randn(5)
        assert torch.equal(neg(x), -x)
        try:
            pnex.jax_op(neg)
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=pnex_env)
    assert out.returncode == 0, out.stderr
    assert "needs JAX: pip install 'pnex_magic[jax]'" in out.stdout


def test_jax_op_of_something_else_is_a_clear_error():
    with pytest.raises(KernelDefinitionError, match="expects an op made by pnex.jit"):
        pnex.jax_op(lambda x: x)


def test_eager_and_jit_match_jnp():
    f = pnex.jax_op(muladd)
    assert isinstance(f, JaxOp) and f.op is muladd
    a, b = randn(5, 7), randn(5, 7)
    np.testing.assert_allclose(f(a, b, 0.25), a * b + 0.25, rtol=1e-6)
    jitted = jax.jit(f, static_argnums=2)
    for c in (0.5, -2.0):  # each scalar value is its own trace
        np.testing.assert_allclose(jitted(a, b, c), a * b + c, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda a, b: f(a, b, 3.0) * 2)(a, b), (a * b + 3.0) * 2, rtol=1e-6)
    np.testing.assert_allclose(f(b=b, a=np.asarray(a), c=np.float32(1.0)), a * b + 1.0, rtol=1e-6)


def test_output_shapes_and_int_and_bool_scalars():
    f = pnex.jax_op(repeat)
    a = randn(5)
    out = f(a, 3, True)
    assert out.shape == (15,) and out.dtype == jnp.float32
    np.testing.assert_array_equal(out, jnp.repeat(a, 3))
    np.testing.assert_array_equal(jax.jit(f, static_argnums=(1, 2))(a, 2, False), -jnp.repeat(a, 2))
    assert jax.eval_shape(lambda a: f(a, 4, True), a).shape == (20,)


def test_inmut_out_init_and_result_order():
    f = pnex.jax_op(accumulate)
    assert repr(f) == (
        "<pnex JAX function accumulate(a: Array[float32, (None,)], m: Array[float32, (a.size(0),)], c: float) -> "
        "tuple[Array[int32, (4,)], Array[float32, (a.size(0),)], Array[float32, (a.size(0),)] (new m)]>"
    )
    a, m = randn(10), randn(10)
    m_before = np.array(m)
    for call in (f, jax.jit(f, static_argnums=2)):
        hist, even, m_new = call(a, m, 2.0)  # the Out arrays, then the new InMut value
        np.testing.assert_allclose(m_new, m_before + 2.0 * np.asarray(a), rtol=1e-6)
        np.testing.assert_array_equal(hist, [3, 3, 2, 2])
        np.testing.assert_array_equal(even, jnp.where(jnp.arange(10) % 2 == 0, a, 1.5))
        np.testing.assert_array_equal(m, m_before)  # JAX arrays are immutable


def test_bfloat16_through_the_simulator():
    f = pnex.jax_op(bf16_axpy)
    a = randn(20).astype(jnp.bfloat16)
    out = f(a, 0.5)
    assert out.dtype == jnp.bfloat16
    expected = (a.astype(jnp.float32) * 0.5 + a.astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32), rtol=1e-2)


def test_an_empty_launch_returns_the_initial_values():
    f = pnex.jax_op(accumulate)
    hist, even, m = f(jnp.zeros(0), jnp.zeros(0), 1.0)
    assert even.shape == (0,) and m.shape == (0,)
    np.testing.assert_array_equal(hist, [0, 0, 0, 0])


def test_vmap_runs_one_launch_per_element():
    f = pnex.jax_op(muladd)
    a, b = randn(3, 4, 5), randn(3, 4, 5)
    out = jax.vmap(lambda a, b: f(a, b, 1.5))(a, b)
    np.testing.assert_allclose(out, a * b + 1.5, rtol=1e-6)
    out = jax.jit(jax.vmap(lambda b: f(a[0], b, 1.5)))(b)  # one argument batched
    np.testing.assert_allclose(out, a[0] * b + 1.5, rtol=1e-6)


def test_scan_over_an_inmut_kernel():
    step = pnex.jax_op(accumulate)
    a = randn(8)

    def body(m, _):
        _, _, m = step(a, m, 1.0)
        return m, m.sum()

    m, sums = jax.jit(lambda m: jax.lax.scan(body, m, length=3))(jnp.zeros(8))
    np.testing.assert_allclose(m, 3 * a, rtol=1e-6)
    np.testing.assert_allclose(sums, [a.sum(), 2 * a.sum(), 3 * a.sum()], rtol=1e-5)


# ------------------------------------------------------------------------------- errors


def _message(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _torch(x):
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


@pytest.mark.parametrize(
    "case",
    ["dtype", "rank", "size", "too many", "missing", "unknown keyword", "out passed", "scalar kind"],
)
def test_errors_are_the_torch_ops(case):
    """The same exception, with the same message, as the PyTorch op on the same arguments."""
    f = pnex.jax_op(muladd)
    a, b = rng().random((4, 3), np.float32), rng().random((4, 3), np.float32)
    calls = {
        "dtype": lambda op: op(a, b.astype(np.int32), 1.0),
        "rank": lambda op: op(a, b[0], 1.0),
        "size": lambda op: op(a, b[:, :2], 1.0),
        "too many": lambda op: op(a, b, 1.0, a),
        "missing": lambda op: op(a, b),
        "unknown keyword": lambda op: op(a, b, d=1.0),
        "out passed": lambda op: op(a, b, 1.0, result=a),
        "scalar kind": lambda op: op(a, b, "one"),
    }
    expected = _message(lambda: calls[case](
        lambda *args, **kw: muladd(*map(_torch, args), **{k: _torch(v) for k, v in kw.items()})))
    assert issubclass(expected[0], (ArgumentTypeError, ArgumentShapeError))
    assert _message(lambda: calls[case](f)) == expected
    if case in ("dtype", "rank", "size"):  # raised when tracing, under jit too
        assert _message(lambda: calls[case](jax.jit(f, static_argnums=2))) == expected


def test_a_traced_scalar_asks_for_a_static_argument():
    f = pnex.jax_op(muladd)
    a = randn(2, 2)
    with pytest.raises(ArgumentTypeError, match=r"argument 'c' is a Scalar\(float32\).*static_argnums.*functools.partial"):
        jax.jit(f)(a, a, 1.0)
    with pytest.raises(ArgumentTypeError, match="must be a jax.Array"):
        f(a.tolist(), a, 1.0)


def test_64_bit_types_need_jax_x64():
    f = pnex.jax_op(cube)
    x = jnp.ones(4)  # float32 while x64 is off
    with pytest.raises(ArgumentTypeError, match=r"must be a float64 tensor, got float32\. .*jax_enable_x64"):
        f(x, x, 1.0)


_SCALE = 1.0


def _define_scaled(scale, with_scalar):
    """One definition re-run (its global constant changed, or its signature): one op name."""
    global _SCALE
    _SCALE = scale
    if with_scalar:
        def scaled(a: pnex.In("f32", (None,)), s: float, out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * s
    else:
        def scaled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] * _SCALE
    return pnex.jit(n_threads="a.numel()", threads_per_block=32)(scaled)


def test_redefinition_same_signature_is_picked_up_and_another_signature_is_refused():
    f = pnex.jax_op(_define_scaled(2.0, False))
    a = randn(6)
    np.testing.assert_allclose(f(a), 2 * a)
    _define_scaled(3.0, False)  # same signature: the op object (and f) now run the new kernel
    np.testing.assert_allclose(f(a), 3 * a)
    _define_scaled(4.0, True)  # another signature: the old object is superseded
    with pytest.raises(KernelDefinitionError, match="from an earlier definition"):
        f(a)


# ------------------------------------------------------------------------------- the magic


def test_magic_jax_binds_the_jax_function(tmp_path, monkeypatch):
    IPython = pytest.importorskip("IPython")
    from IPython.testing import globalipapp

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    ip = IPython.get_ipython() or globalipapp.start_ipython()  # the shell tests/magic_helpers.py starts
    ip.run_line_magic("load_ext", "pnex_magic")
    ip.run_cell("import torch, jax.numpy as jnp")
    cell = textwrap.dedent(
        """
        def neg(a: In("f32", (None,)), out: Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = -a[i]
        """
    )
    ip.run_cell_magic("pnex", "--jax --n-threads a.numel() --threads-per-block 32 --args torch.ones(4) -o rep", cell)
    f = ip.user_ns["neg"]
    assert isinstance(f, JaxOp)
    a = randn(5)
    np.testing.assert_array_equal(f(a), -a)
    torch.testing.assert_close(f.op(torch.ones(3)), -torch.ones(3))
    rep = ip.user_ns["rep"]
    assert rep.binding_text().startswith(f"bound neg = jax_op(pnex::{f.op.definition.op_name})")
    assert "jax.Arrays" in rep.signature_html() and "neg.op(a)" in rep.signature_html()
    backward = textwrap.dedent(
        """
        def neg_backward(grad_out: In("f32", (None,)), grad_a: Out("f32", "grad_out")):
            i = cuda.grid(1)
            if i < grad_out.shape[0]:
                grad_a[i] = -grad_out[i]
        """
    )
    ip.run_cell_magic("pnex", "--jax --n-threads grad_out.numel() --threads-per-block 32 --backward-of neg", backward)
    np.testing.assert_array_equal(jax.grad(lambda a: (f(a) * a).sum())(a), -2 * a)


# ------------------------------------------------------------------------------- on a GPU


def _jax_gpus():
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


gpu = pytest.mark.gpu
needs_jax_gpu = pytest.mark.skipif(not _jax_gpus(), reason="JAX has no CUDA backend here")


@gpu
@needs_jax_gpu
def test_gpu_calls_match_jnp_and_run_through_xla():
    f = pnex.jax_op(muladd)
    a, b = randn(300, 200), randn(300, 200)
    assert a.devices() == {jax.devices("cuda")[0]}
    # atol: XLA fuses a * b + c into one FMA, the kernel rounds the product first
    np.testing.assert_allclose(f(a, b, 0.5), a * b + 0.5, rtol=1e-6, atol=1e-6)
    jitted = jax.jit(f, static_argnums=2)
    np.testing.assert_allclose(jitted(a, b, -1.0), a * b - 1.0, rtol=1e-6, atol=1e-6)
    assert xla.TARGET in jitted.lower(a, b, -1.0).as_text()
    out = jax.jit(jax.vmap(lambda a, b: f(a, b, 2.0)))(a.reshape(4, 75, 200), b.reshape(4, 75, 200))
    np.testing.assert_allclose(out.reshape(300, 200), a * b + 2.0, rtol=1e-6, atol=1e-6)


@gpu
@needs_jax_gpu
def test_gpu_inmut_init_scalars_and_bfloat16():
    acc = pnex.jax_op(accumulate)
    a, m = randn(1000), randn(1000)
    hist, even, m_new = jax.jit(acc, static_argnums=2)(a, m, 2.0)
    np.testing.assert_allclose(m_new, m + 2 * a, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(hist, [250, 250, 250, 250])
    np.testing.assert_array_equal(even, jnp.where(jnp.arange(1000) % 2 == 0, a, 1.5))
    np.testing.assert_array_equal(pnex.jax_op(repeat)(a, 3, False), -jnp.repeat(a, 3))
    x = randn(513).astype(jnp.bfloat16)
    expected = (x.astype(jnp.float32) * 0.5 + x.astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_allclose(pnex.jax_op(bf16_axpy)(x, 0.5).astype(np.float32), expected.astype(np.float32), rtol=1e-2)


@gpu
@needs_jax_gpu
def test_gpu_grad_in_float64(x64):
    f = pnex.jax_op(cube)
    x, w = randn(1000, dtype=np.float64), randn(1000, dtype=np.float64)
    check_grads(lambda x, w: f(x, w, 0.5), (x, w), order=1, modes=["rev"])


@gpu
@needs_jax_gpu
@pytest.mark.skipif(len(_jax_gpus()) < 2, reason="needs 2 GPUs visible to JAX")
def test_gpu_second_device():
    f = pnex.jax_op(muladd)
    for device in jax.devices("cuda")[:2]:
        a = jax.device_put(randn(64, 48), device)
        b = jax.device_put(randn(64, 48), device)
        out = jax.jit(f, static_argnums=2)(a, b, 1.0)
        assert out.devices() == {device}
        # float64 reference; the tolerance admits one fused multiply-add's rounding
        expected = np.asarray(a, np.float64) * np.asarray(b, np.float64) + 1.0
        np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=1e-6, atol=1e-6)


@gpu
@needs_jax_gpu
def test_gpu_scan_of_the_diffusion_stencil_matches_pytorch():
    step = pnex.jax_op(workloads.diffusion_step)
    field = workloads.initial_field(200)
    steps, coeff = 50, 0.25

    @jax.jit
    def run(u):
        def body(carry, _):
            u, scratch = carry
            return (step(u, scratch, coeff), u), None

        (u, _), _ = jax.lax.scan(body, (u, jnp.zeros_like(u)), length=steps)
        return u

    out = run(jnp.asarray(field.numpy()))
    expected = workloads.run_diffusion(workloads.diffusion_step, field.cuda(), steps, coeff)
    np.testing.assert_allclose(np.asarray(out), expected.cpu().numpy(), rtol=1e-5, atol=1e-6)


@gpu
@needs_jax_gpu
def test_gpu_lltm_forward_and_backward_match_pytorch():
    ops = workloads.lltm_ops(torch.float32)
    forward = pnex.jax_op(ops.forward)
    gates, old_cell = randn(64, 3 * 128), randn(64, 128)

    def loss(gates, old_cell):
        h, c = forward(gates, old_cell)
        return (h * h).sum() + c.sum()

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(gates, old_cell)
    tg = torch.tensor(np.asarray(gates), device="cuda", requires_grad=True)
    tc = torch.tensor(np.asarray(old_cell), device="cuda", requires_grad=True)
    h, c = ops.forward(tg, tc)
    expected = (h * h).sum() + c.sum()
    expected.backward()
    np.testing.assert_allclose(value, expected.item(), rtol=1e-5)
    np.testing.assert_allclose(grads[0], tg.grad.cpu().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[1], tc.grad.cpu().numpy(), rtol=1e-5, atol=1e-6)
