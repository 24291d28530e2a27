"""GPU tests: the C++ launcher and the Python driver launcher on real devices.

Skipped with a reason where no NVIDIA GPU is present (marker ``gpu``)."""


import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic.errors import ArgumentShapeError, ArgumentTypeError

pytestmark = pytest.mark.gpu

ALL_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
]


def _random(shape, dtype, device="cuda"):
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    hi = 100 if dtype != torch.uint8 else 250
    return torch.randint(0, hi, shape).to(dtype).to(device)


_SIGNED_VIEW = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _same(x, y):
    """Exact equality, also for dtypes with few CUDA kernels (uint16/32/64)."""
    if x.dtype in _SIGNED_VIEW:
        x, y = x.contiguous().view(_SIGNED_VIEW[x.dtype]), y.contiguous().view(_SIGNED_VIEW[y.dtype])
    return x.shape == y.shape and torch.equal(x, y)


def _copy_op(dtype, to_extension=False):
    @pnex.jit(n_threads="a.numel()", to_extension=to_extension)
    def copy_any(a: pnex.In(dtype, (None, None)), out: pnex.Out(dtype, "a")):
        i = cuda.grid(1)
        if i < a.size:
            r, c = divmod(i, a.shape[1])
            out[r, c] = a[r, c]

    return copy_any


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_every_dtype_copies_on_gpu(dtype, launcher):
    op = _copy_op(dtype)
    assert op._native == (launcher == "native")
    a = _random((37, 53), dtype)
    out = op(a)
    assert out.device == a.device and out.dtype == dtype
    assert _same(out, a)
    # transposed and sliced inputs: strides are passed, no copies made
    b = _random((53, 80), dtype).t()[:, ::2]
    assert _same(op(b), b)


def test_scalars_of_every_float_type(launcher):
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):

        @pnex.jit(n_threads="x.numel()")
        def axpy(x: pnex.In(dtype, (None,)), alpha: pnex.Scalar(dtype), y: pnex.Out(dtype, "x")):
            i = cuda.grid(1)
            if i < x.shape[0]:
                y[i] = x[i] * alpha

        x = _random((1000,), dtype)
        ref = (x.double() * 0.75).to(dtype)
        torch.testing.assert_close(axpy(x, 0.75), ref)


def test_muladd_grid_inmut_init_and_several_outputs(launcher):
    @pnex.jit(n_threads=("result.size(1)", "result.size(0)"), to_extension=True)
    def muladd(
        a: pnex.In("f32", (None, None)),
        b: pnex.In("f32", ("a.size(0)", "a.size(1)")),
        c: float,
        counter: pnex.InMut("i32", (1,)),
        result: pnex.Out("f32", "a"),
        rowsum: pnex.Out("f32", ("a.size(0)",), init=0),
    ):
        x, y = cuda.grid(2)
        if y < result.shape[0] and x < result.shape[1]:
            v = a[y, x] * b[y, x] + c
            result[y, x] = v
            cuda.atomic.add(rowsum, y, v)
            cuda.atomic.add(counter, 0, 1)

    a, b = torch.randn(300, 200, device="cuda"), torch.randn(300, 200, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    result, rowsum = muladd(a, b, 0.5, counter)
    ref = a.double() * b.double() + 0.5
    torch.testing.assert_close(result.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rowsum.double(), ref.sum(1), rtol=1e-4, atol=1e-3)
    assert counter.item() == 300 * 200


TILE = 16  # module-level constants: Numba needs shared-array shapes at compile time
HALO = TILE + 2


def test_shared_memory_stencil_and_histogram(launcher):

    @pnex.jit(n_threads=("u.size(1)", "u.size(0)"), threads_per_block=(TILE, TILE))
    def laplacian(u: pnex.In("f32", (None, None)), out: pnex.Out("f32", "u", init=0)):
        tile = cuda.shared.array((HALO, HALO), dtype=np.float32)
        x, y = cuda.grid(2)
        tx, ty = cuda.threadIdx.x + 1, cuda.threadIdx.y + 1
        n, m = u.shape
        if y < n and x < m:
            tile[ty, tx] = u[y, x]
            if tx == 1 and x > 0:
                tile[ty, 0] = u[y, x - 1]
            if tx == TILE and x < m - 1:
                tile[ty, TILE + 1] = u[y, x + 1]
            if ty == 1 and y > 0:
                tile[0, tx] = u[y - 1, x]
            if ty == TILE and y < n - 1:
                tile[TILE + 1, tx] = u[y + 1, x]
        cuda.syncthreads()
        if 0 < y < n - 1 and 0 < x < m - 1:
            out[y, x] = tile[ty - 1, tx] + tile[ty + 1, tx] + tile[ty, tx - 1] + tile[ty, tx + 1] - 4 * tile[ty, tx]

    u = torch.randn(300, 257, device="cuda")
    ref = torch.zeros_like(u, dtype=torch.float64)
    d = u.double()
    ref[1:-1, 1:-1] = d[:-2, 1:-1] + d[2:, 1:-1] + d[1:-1, :-2] + d[1:-1, 2:] - 4 * d[1:-1, 1:-1]
    torch.testing.assert_close(laplacian(u).double(), ref, rtol=1e-5, atol=1e-5)
    assert pnex.inspect(laplacian).shared_bytes >= HALO * HALO * 4  # the tile, plus what Numba reserves

    @pnex.jit(n_threads="x.numel()")
    def histogram(x: pnex.In("i64", (None,)), bins: int, counts: pnex.Out("i64", ("bins",), init=0)):
        i = cuda.grid(1)
        if i < x.shape[0]:
            cuda.atomic.add(counts, x[i], 1)

    x = torch.randint(0, 37, (100_000,), device="cuda")
    assert torch.equal(histogram(x, 37), torch.bincount(x, minlength=37))


def test_unused_and_3d_grid(launcher):
    WITH_ARGMAX = False

    @pnex.jit(n_threads=("a.size(2)", "a.size(1)", "a.size(0)"))
    def scale3(
        a: pnex.In("f64", (None, None, None)),
        out: pnex.Out("f64", "a"),
        where: pnex.Out("i64", "a") if WITH_ARGMAX else pnex.Unused,
    ):
        x, y, z = cuda.grid(3)
        if z < a.shape[0] and y < a.shape[1] and x < a.shape[2]:
            out[z, y, x] = 2 * a[z, y, x]
            if WITH_ARGMAX:
                where[z, y, x] = x

    a = torch.randn(9, 17, 33, device="cuda", dtype=torch.float64)
    assert torch.equal(scale3(a), 2 * a)


def test_current_stream_and_cuda_graph(launcher):
    op = _copy_op(torch.float32)
    s = torch.cuda.Stream()
    a = torch.randn(64, 64, device="cuda")
    with torch.cuda.stream(s):
        out = op(a)
    s.synchronize()
    assert torch.equal(out, a)

    static_in = torch.randn(128, 33, device="cuda")
    op(static_in)  # warm-up (module load) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = op(static_in)
    fresh = torch.randn(128, 33, device="cuda")
    static_in.copy_(fresh)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, fresh)


def test_torch_compile_default_and_reduce_overhead(launcher):
    @pnex.jit(n_threads="a.numel()")
    def add_scaled(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), s: float, out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + s * b[i]

    def f(a, b):
        return torch.relu(add_scaled(a, b, 3.0)) + 1

    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    ref = torch.relu(a + 3.0 * b) + 1
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(a, b), ref)
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        a2, b2 = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
        torch.testing.assert_close(g(a2, b2), torch.relu(a2 + 3.0 * b2) + 1)


def test_opcheck_on_gpu(launcher):
    op = _copy_op(torch.float32)
    torch.library.opcheck(op, (torch.randn(20, 30, device="cuda"),))

    @pnex.jit(n_threads="x.numel()")
    def inc(x: pnex.InMut("f32", (None,)), by: float):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += by

    x = torch.randn(1000, device="cuda")
    torch.library.opcheck(inc, (x.clone(), 1.5))
    ref = x + 1.5
    inc(x, 1.5)
    torch.testing.assert_close(x, ref)


def test_clear_errors_from_the_launcher(launcher):
    @pnex.jit(n_threads="a.numel()")
    def add(a: pnex.In("f32", (None,)), b: pnex.In("f32", ("a.size(0)",)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + b[i]

    a = torch.randn(10, device="cuda")
    with pytest.raises(ArgumentTypeError, match=r"argument 'b' must be a float32 tensor, got float64"):
        add(a, torch.randn(10, device="cuda", dtype=torch.float64))
    with pytest.raises(ArgumentShapeError, match=r"argument 'b' must have size a.size\(0\) = 10 on axis 0, got 11"):
        add(a, torch.randn(11, device="cuda"))
    with pytest.raises(ArgumentShapeError, match=r"argument 'b' must have 1 dimension"):
        add(a, torch.randn(10, 1, device="cuda"))
    with pytest.raises(ArgumentTypeError, match=r"argument 'b' is on cpu but 'a' is on cuda"):
        add(a, torch.randn(10))


def test_autograd_through_the_native_launcher():
    @pnex.jit(n_threads="x.numel()")
    def square(x: pnex.In("f32", (None,)), y: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i] * x[i]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad

    x = torch.randn(100, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="not implemented|autograd"):
        square(x).sum().backward()
    square.register_autograd(backward, setup_context=setup_context)
    x.grad = None
    square(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def _python_frames_of(fn, *args, **kwargs):
    """The code names of the Python frames a call runs (sys.setprofile's 'call' events)."""
    names = []

    def profile(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_qualname if hasattr(frame.f_code, "co_qualname") else frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return result, names


def test_the_op_objects_call_runs_no_python_with_the_native_launcher():
    """With the C++ launcher, a positional call goes from the C call slot straight to the
    OpOverload's C++ entry: no Python frame (not PnexOp.__call__); keywords, a scalar of
    another type, a superseded op and every error still take the Python checks."""
    from pnex_magic.errors import KernelDefinitionError

    @pnex.jit(n_threads="a.numel()")
    def fast_axpb(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), s: float, k: int, out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * s + b[i] + k

    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    expected = a.double() * 0.5 + b.double() + 3
    fast_axpb(a, b, 0.5, 3)  # first call: loads the module
    out, frames = _python_frames_of(fast_axpb, a, b, 0.5, 3)
    assert not [f for f in frames if "__call__" in f], frames
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    out, frames = _python_frames_of(fast_axpb, a, b, 2, 3)  # an int for a float: the exact-type check sends it on
    torch.testing.assert_close(out.double(), a.double() * 2 + b.double() + 3, rtol=1e-6, atol=1e-6)
    out, frames = _python_frames_of(fast_axpb, a, b, s=0.5, k=3)
    assert any("__call__" in f for f in frames), frames
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    # Errors from the fast path are the Python path's, with pnex's types and messages.
    with pytest.raises(ArgumentTypeError, match=r"argument 'k' must be a Python int"):
        fast_axpb(a, b, 0.5, True)
    with pytest.raises(ArgumentTypeError, match=r"argument 'b' must be a torch.Tensor"):
        fast_axpb(a, [1.0], 0.5, 3)
    with pytest.raises(ArgumentShapeError, match=r"argument 'b'"):
        fast_axpb(a, torch.randn(7, device="cuda"), 0.5, 3)
    with pytest.raises(ArgumentTypeError, match=r"argument 'b' must be a float32 tensor"):
        fast_axpb(a, b.double(), 0.5, 3)
    with pytest.raises(ArgumentTypeError, match=r"missing argument\(s\) .k."):
        fast_axpb(a, b, 0.5)
    # Under torch.compile, Dynamo reads the class's Python __call__.
    compiled = torch.compile(lambda a, b: fast_axpb(a, b, 0.5, 3) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a, b).double(), expected * 2, rtol=1e-6, atol=1e-5)
    old = fast_axpb

    @pnex.jit(n_threads="a.numel()")
    def fast_axpb(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):  # noqa: F811 (a new signature)
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i]

    with pytest.raises(KernelDefinitionError, match="earlier definition"):
        old(a, b, 0.5, 3)
    torch.testing.assert_close(fast_axpb(a), a)


def test_the_native_autograd_kernel():
    """No input requires grad: the output has no grad_fn (the call skips autograd's
    fallback).  An input that requires grad, or carries a forward-mode gradient: the
    not-implemented fallback records the call and backward refuses."""
    import torch.autograd.forward_ad as fwAD

    @pnex.jit(n_threads="x.numel()")
    def twice(x: pnex.In("f32", (None,)), y: pnex.In("f32", "x"), out: pnex.Out("f32", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = 2 * x[i] + y[i]

    x, y = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    out = twice(x, y)
    assert out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, 2 * x + y)
    w = y.clone().requires_grad_()
    out = twice(x, w)
    assert out.requires_grad and out.grad_fn is not None
    with pytest.raises(RuntimeError, match="not implemented|autograd"):
        out.sum().backward()
    with torch.no_grad():
        assert twice(x, w).grad_fn is None
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="forward AD|not support"):
            twice(dual, y)
    view = x[:32]  # a view (autograd metadata, no grad): the fast path
    assert twice(view, y[:32]).grad_fn is None


def test_kernel_uses_a_cubin_for_the_device_and_respects_max_registers():
    @pnex.jit(n_threads="a.numel()", max_registers=32)
    def poly(a: pnex.In("f64", (None,)), out: pnex.Out("f64", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            x = a[i]
            out[i] = ((((x * 1.1 + 2.2) * x + 3.3) * x + 4.4) * x + 5.5) * x
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    compiled = poly.definition.compiled(arch)
    assert compiled.cubin is not None and compiled.arch == arch
    assert compiled.resources.registers <= 32
    a = torch.randn(1000, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(poly(a), ((((a * 1.1 + 2.2) * a + 3.3) * a + 4.4) * a + 5.5) * a)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_devices(launcher):
    op = _copy_op(torch.float32)
    a0 = torch.randn(50, 60, device="cuda:0")
    assert torch.equal(op(a0), a0)
    a1 = torch.randn(70, 20, device="cuda:1")
    out1 = op(a1)
    assert out1.device == torch.device("cuda:1")
    assert torch.equal(out1, a1)
    with torch.cuda.device(1):
        b0 = torch.randn(10, 10, device="cuda:0")
        assert torch.equal(op(b0), b0)


FAULT_SCRIPT = textwrap.dedent(
    """
    import torch, pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="a.numel()")
    def out_of_bounds(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i + (1 << 40)] = a[i]

    try:
        out_of_bounds(torch.ones(1024, device="cuda"))
        torch.cuda.synchronize()
    except pnex.KernelLaunchError as exc:
        print("CAUGHT", type(exc).__name__, exc)
    """
)


@pytest.mark.parametrize("mode", ["native", "driver"])
def test_faulting_kernel_is_named(mode, tmp_path):
    env = dict(os.environ, PNEX_LAUNCH_BLOCKING="1", PNEX_LAUNCHER=mode)
    proc = subprocess.run(
        [sys.executable, "-c", FAULT_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert "CAUGHT KernelLaunchError" in proc.stdout, proc.stdout + proc.stderr
    assert "out_of_bounds" in proc.stdout
    assert "Aborted" not in proc.stderr and proc.returncode == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_two_processes():
    job = os.path.join(os.path.dirname(__file__), "ddp_job.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", job],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("DDP gradients through pnex op match") == 2, proc.stdout


def test_the_default_arch_starts_no_pytorch_cuda_context(pnex_env):
    """Defining (and compiling) a kernel asks the driver for the GPU's architecture:
    PyTorch's CUDA is not initialised by it (a JAX program, or a process that only
    compiles, never pays for that), and the answer is the GPU's."""
    code = (
        "import torch\nfrom pnex_magic.arch import default_arch\n"
        "arch = default_arch()\nstarted = torch.cuda.is_initialized()\n"
        "print(arch, started, 'sm_%d%d' % torch.cuda.get_device_capability(0))"
    )
    env = {k: v for k, v in pnex_env.items() if k != "PNEX_ARCH"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    arch, started, expected = proc.stdout.split()
    assert started == "False" and arch == expected
