"""The JAX front end: pnex ops as JAX functions (``pnex_magic.jax_op``).

CPU tests run every call through ``jax.pure_callback`` and numba-cuda's CUDA
simulator (what the ``pnex_launch`` primitive lowers to on the CPU backend), so
sizes are tiny and blocks small; results are checked against ``jax.numpy`` on
fresh random inputs and errors against the PyTorch op's own.  The GPU branch is
checked here as far as it goes without a GPU: its lowering (the FFI call, its
attributes and aliases, exported for the ``cuda`` platform) and the FFI handler's
build.  Tests marked ``gpu`` run the same kernels through XLA on a GPU.
"""

import ctypes
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
from pnex_magic.launch import background, build, xla  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import workloads  # noqa: E402


def rng():
    return np.random.default_rng()  # fresh inputs every run


def randn(*shape, dtype=np.float32):
    return jnp.asarray(rng().standard_normal(shape).astype(dtype))


@pytest.fixture
def x64():
    """64-bit JAX types for one test."""
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


# ------------------------------------------------------------------------------- kernels


@pnex.jit(n_threads=("result.size(1)", "result.size(0)"), threads_per_block=(8, 4))
def muladd(
    a: pnex.In("f32", (None, None)),
    b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
    c: float,
    result: pnex.Out("f32", "a"),
):
    x, y = cuda.grid(2)
    if y < result.shape[0] and x < result.shape[1]:
        result[y, x] = a[y, x] * b[y, x] + c


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def accumulate(
    a: pnex.In("f32", (None,)),
    m: pnex.InMut("f32", "a"),
    c: float,
    hist: pnex.Out("i32", (4,), init=0),
    even: pnex.Out("f32", "a", init=1.5),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        m[i] += a[i] * c
        cuda.atomic.add(hist, i % 4, 1)
        if i % 2 == 0:
            even[i] = a[i]


@pnex.jit(n_threads="out.numel()", threads_per_block=32)
def repeat(a: pnex.In("f32", (None,)), k: int, flag: bool, out: pnex.Out("f32", ("a.size(0) * k",))):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i // k] if flag else -a[i // k]


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def bf16_axpy(a: pnex.In("bf16", (None,)), s: pnex.Scalar("bf16"), out: pnex.Out("bf16", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * s + a[i]


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def cube(x: pnex.In("f64", (None,)), w: pnex.In("f64", "x"), c: pnex.Scalar("f64"), y: pnex.Out("f64", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * x[i] * x[i] * w[i] + c


@pnex.backward_of(cube)
@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def cube_backward(
    grad_y: pnex.In("f64", (None,)),
    x: pnex.In("f64", "grad_y"),
    w: pnex.In("f64", "grad_y"),
    grad_x: pnex.Out("f64", "x"),
    grad_w: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        grad_x[i] = 3 * x[i] * x[i] * w[i] * grad_y[i]
        grad_w[i] = x[i] * x[i] * x[i] * grad_y[i]


def cube_reference(x, w, c):
    return x * x * x * w + c


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


# ------------------------------------------------------------------------------- the GPU branch, without a GPU


def _cuda_module_text(fn, *args):
    exported = jax.export.export(
        jax.jit(fn), platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(xla.TARGET)]
    )(*args)
    return exported.mlir_module()


def test_cuda_lowering_is_one_ffi_call_aliasing_only_the_inmut_argument():
    f = pnex.jax_op(accumulate)
    a = randn(40)
    text = _cuda_module_text(lambda a, m: f(a, m, 2.0), a, a)
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and f"@{xla.TARGET}(%arg0, %arg1)" in calls[0]  # the two arguments, no filled buffers
    assert "stablehlo.case" not in text and "callback" not in text  # lowered for CUDA alone: no platform switch
    call = calls[0]
    assert "grid = dense<[2, 1, 1]>" in call and "block = dense<[32, 1, 1]>" in call
    slot = xla.scalar_slots(accumulate.spec, {"c": 2.0})
    assert slot == [int(np.float32(2.0).view(np.int32))] and f"scalars = dense<{slot[0]}>" in call
    # results (hist, even, m): only m aliases an operand (1, the InMut argument); the handler fills
    # hist (int32 0: bytes of 0) and even (float32 1.5: 32-bit pattern 0x3FC00000) with memsets
    assert call.count("output_operand_alias<") == 1
    assert "output_tuple_indices = [2], operand_index = 1," in call
    assert f"fill = dense<[1, 0, 4, {0x3FC00000}, 0, 0]>" in call
    cpu = jax.jit(lambda a, m: f(a, m, 2.0)).lower(a, a).as_text()
    assert xla.TARGET not in cpu and "callback" in cpu and "stablehlo.case" not in cpu


def test_a_gpu_trace_uses_a_python_callback_until_the_handler_is_built(monkeypatch):
    """On a machine with GPUs (pretended here), a trace lowered for CUDA while the XLA
    handler is not built launches through ``jax.experimental.buffer_callback`` (the
    Python driver launcher on XLA's buffers, the InMut result aliased as for the
    handler); once it is built, a new trace calls it; an export always names it."""
    from pnex_magic.frontends import jax as jax_front

    f = pnex.jax_op(accumulate)
    a = randn(40)
    monkeypatch.setattr(jax_front, "_cuda_archs", lambda: ("9.0",))
    asked = []
    monkeypatch.setattr(xla, "ready", lambda verbose=False: asked.append(verbose) or False)

    def cuda_text():
        return jax.jit(lambda a, m: f(a, m, 2.0)).trace(a, a).lower(lowering_platforms=("cuda",)).as_text()

    waiting = cuda_text()
    assert "xla_buffer_python_gpu_callback" in waiting and xla.TARGET not in waiting and asked
    [call] = [line for line in waiting.splitlines() if "xla_buffer_python_gpu_callback" in line]
    assert call.count("output_operand_alias<") == 1 and "output_tuple_indices = [2], operand_index = 1," in call
    assert xla.TARGET in _cuda_module_text(lambda a, m: f(a, m, 2.0), a, a)  # an export: the handler
    monkeypatch.setattr(xla, "ready", lambda verbose=False: True)
    monkeypatch.setattr(jax_front, "_kernel_id", lambda definition, variant=0: 7)
    built = cuda_text()
    assert xla.TARGET in built and "callback" not in built


def test_the_handler_builds_in_a_background_process_and_serves_once_built(monkeypatch, tmp_path):
    """xla.ready() starts the handler's build in the background (once) and says no; with
    PNEX_LAUNCHER=driver it never uses the handler; once a build is there it loads it."""
    from pnex_magic.launch import background

    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PNEX_LAUNCHER", "auto")
    monkeypatch.setattr(xla, "_library", None)
    monkeypatch.setattr(xla, "_targets", {})
    monkeypatch.setattr(xla, "_include_dirs", lambda: [str(tmp_path)])
    monkeypatch.setattr(background, "problem", lambda target: None)
    started = []
    monkeypatch.setattr(background, "start", lambda target, **kw: started.append(target) or True)
    loaded = []
    monkeypatch.setattr(xla, "load_library", lambda verbose=False: loaded.append(verbose))
    assert xla.ready() is False and [t.stem for t in started] == ["pnex_jax_ffi"] and loaded == []
    monkeypatch.setenv("PNEX_LAUNCHER", "driver")
    assert xla.ready() is False and len(started) == 1
    monkeypatch.setenv("PNEX_LAUNCHER", "auto")
    [target] = started
    target.folder.mkdir(parents=True)
    (target.folder / "libpnex_jax_ffi.so").write_bytes(b"a library")  # what the build process leaves
    build.record_build("libpnex_jax_ffi", target.folder)
    assert xla.ready() is True and loaded == [False] and len(started) == 1


def test_call_layout_table():
    layout = xla.call_layout(accumulate.spec)
    assert layout.operands == ("a", "m") and layout.results == ("hist", "even", "m")
    assert dict(layout.aliases) == {1: 2} and layout.scalars == ("c",)
    assert layout.fills == (1, 0, 4, 0x3FC00000, 0, 0)
    #                    a             m             c             hist          even
    assert layout.table == (0, 0, 1, 4, 1, 2, 1, 4, 3, 0, 0, 8, 2, 0, 1, 4, 2, 1, 1, 4)


@pytest.mark.skipif(build.cuda_include_dir() is None, reason="no CUDA headers (cuda.h) here")
def test_ffi_handler_builds_and_registers_kernels(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    path = xla.build_library()
    assert path.exists() and path.name == "libpnex_jax_ffi.so"
    assert xla.build_library() == path  # built once
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    for symbol in ("PnexJaxInstantiate", "PnexJaxLaunch", "pnex_jax_register", "pnex_jax_add_image", "pnex_jax_archs",
                   "pnex_jax_state_type_id", "pnex_jax_state_type_info", "pnex_jax_set_shared"):
        assert f" T {symbol}" in symbols
    kernel_id = xla.register_kernel(accumulate.definition, ["sm_90", "8.0"])
    assert xla.register_kernel(accumulate.definition, ["sm_90"]) == kernel_id
    lib = xla.load_library()
    archs = (ctypes.c_int64 * 4)()
    assert lib.pnex_jax_archs(kernel_id, archs, 4) == 2 and sorted(archs[:2]) == [80, 90]
    assert lib.pnex_jax_archs(10**9, archs, 4) == -1
    assert lib.pnex_jax_set_shared(kernel_id, 4096) == 0 and lib.pnex_jax_set_shared(10**9, 4096) == -1


def test_ffi_build_failure_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path))
    source = tmp_path / "broken.cpp"
    source.write_text("int broken( {\n")
    with pytest.raises(pnex.KernelCompileError, match="could not build its test library") as info:
        background.build_shared_library("broken", [source], includes=[], what="test library")
    assert "broken.cpp" in info.value.compiler_log
    assert not list(tmp_path.rglob("libbroken.so"))


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
