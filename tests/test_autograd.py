"""Autograd for pnex ops: backward kernels attached with pnex_magic.autograd.

On CPU tensors every kernel runs in numba-cuda's CUDA simulator, so sizes are tiny
and blocks small.  Gradients are checked with ``torch.autograd.gradcheck`` in
float64, with ``torch.library.opcheck`` (its autograd tests included) and through
``torch.compile(fullgraph=True)``, against plain PyTorch.  The LLTM kernels are
the ones ``benchmarks/workloads.py`` and ``notebooks/03_lltm.ipynb`` use.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ArgumentShapeError, KernelDefinitionError
from pnex_magic.autograd import attach_backward, backward_of, save_for_backward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import workloads  # noqa: E402

F64 = torch.float64


def rand(*shape, dtype=F64, requires_grad=True):
    g = torch.Generator()
    g.seed()  # fresh inputs every run
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


# --------------------------------------------------------------------------------------
# An element-wise op: result = a * b + c, its backward attached with the decorator form.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def muladd(
    a: pnex.In("f64", (None,)),
    b: pnex.In("f64", "a"),
    c: pnex.Scalar("f64"),
    result: pnex.Out("f64", "a"),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] * b[i] + c


@backward_of(muladd)
@pnex.jit(n_threads="a.numel()", threads_per_block=32)
def muladd_backward(
    grad_result: pnex.In("f64", (None,)),
    a: pnex.In("f64", "grad_result"),
    b: pnex.In("f64", "grad_result"),
    grad_a: pnex.Out("f64", "a"),
    grad_b: pnex.Out("f64", "a"),
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        grad_a[i] = grad_result[i] * b[i]
        grad_b[i] = grad_result[i] * a[i]


def test_muladd_gradcheck():
    a, b = rand(7), rand(7)
    assert torch.autograd.gradcheck(lambda a, b: muladd(a, b, 0.5), (a, b))


def test_muladd_grads_match_torch():
    a, b = rand(9), rand(9)
    w = torch.randn(9, dtype=F64)
    (muladd(a, b, -1.5) * w).sum().backward()
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    ((a2 * b2 - 1.5) * w).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


def test_only_some_inputs_need_grad():
    a, b = rand(5), rand(5, requires_grad=False)
    (grad_a,) = torch.autograd.grad(muladd(a, b, 2.0).sum(), [a])
    torch.testing.assert_close(grad_a, b)


def test_non_contiguous_incoming_gradient():
    # The gradient of a transposed/expanded use of the result is not contiguous;
    # the backward kernel receives a contiguous copy.
    a, b = rand(6), rand(6)
    y = muladd(a, b, 0.0)
    loss = (y.view(2, 3).t() * torch.arange(6, dtype=F64).view(3, 2)).sum()
    loss.backward()
    expected = torch.arange(6, dtype=F64).view(3, 2).t().reshape(6)
    torch.testing.assert_close(a.grad, expected * b.detach())


def test_muladd_opcheck_including_autograd():
    torch.library.opcheck(muladd, (rand(5), rand(5), 0.25))
    torch.library.opcheck(muladd, (rand(5), rand(5, requires_grad=False), 0.25))
    torch.library.opcheck(muladd_backward, (rand(5, requires_grad=False), rand(5, requires_grad=False), rand(5, requires_grad=False)))


@pytest.mark.slow
def test_muladd_torch_compile_backward():
    def loss_fn(a, b):
        return (muladd(a, b, 0.5) ** 2).sum()

    compiled = torch.compile(loss_fn, fullgraph=True)
    a, b = rand(11), rand(11)
    compiled(a, b).backward()
    a2, b2 = a.detach().requires_grad_(), b.detach().requires_grad_()
    ((a2 * b2 + 0.5) ** 2).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


# --------------------------------------------------------------------------------------
# A scalar the backward needs, two outputs, and a custom setup_context.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def poly(
    x: pnex.In("f64", (None,)),
    alpha: pnex.Scalar("f64"),
    square: pnex.Out("f64", "x"),
    cube: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        square[i] = alpha * x[i] * x[i]
        cube[i] = x[i] * x[i] * x[i]


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def poly_backward(
    grad_square: pnex.In("f64", (None,)),
    grad_cube: pnex.In("f64", "grad_square"),
    x: pnex.In("f64", "grad_square"),
    alpha: pnex.Scalar("f64"),
    grad_x: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        grad_x[i] = 2 * alpha * x[i] * grad_square[i] + 3 * x[i] * x[i] * grad_cube[i]


attach_backward(poly, poly_backward)


def test_scalar_saved_for_backward_gradcheck():
    assert torch.autograd.gradcheck(lambda x: poly(x, 1.75), (rand(6),))


def test_unused_output_gets_zero_gradient():
    x = rand(5)
    square, _ = poly(x, 3.0)
    square.sum().backward()
    torch.testing.assert_close(x.grad, 6.0 * x.detach())


def test_poly_opcheck():
    torch.library.opcheck(poly, (rand(4), 0.5))


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def poly_backward_from_ctx(
    grad_square: pnex.In("f64", (None,)),
    grad_cube: pnex.In("f64", "grad_square"),
    x_squared: pnex.In("f64", "grad_square"),
    x: pnex.In("f64", "grad_square"),
    two_alpha: pnex.Scalar("f64"),
    grad_x: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        grad_x[i] = two_alpha * x[i] * grad_square[i] + 3 * x_squared[i] * grad_cube[i]


def test_custom_setup_context():
    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def poly2(
        x: pnex.In("f64", (None,)),
        alpha: pnex.Scalar("f64"),
        square: pnex.Out("f64", "x"),
        cube: pnex.Out("f64", "x"),
    ):
        i = cuda.grid(1)
        if i < x.shape[0]:
            square[i] = alpha * x[i] * x[i]
            cube[i] = x[i] * x[i] * x[i]

    def setup_context(ctx, inputs, output):
        x, alpha = inputs
        save_for_backward(ctx, x=x, x_squared=x * x)
        ctx.two_alpha = 2 * alpha

    attach_backward(poly2, poly_backward_from_ctx, setup_context=setup_context)
    assert torch.autograd.gradcheck(lambda x: poly2(x, -0.5), (rand(5),))


def test_custom_setup_context_that_forgets_a_tensor():
    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def poly3(
        x: pnex.In("f64", (None,)),
        alpha: pnex.Scalar("f64"),
        square: pnex.Out("f64", "x"),
        cube: pnex.Out("f64", "x"),
    ):
        i = cuda.grid(1)
        if i < x.shape[0]:
            square[i] = alpha * x[i] * x[i]
            cube[i] = x[i]

    def setup_context(ctx, inputs, output):
        save_for_backward(ctx, x=inputs[0])
        ctx.two_alpha = 2.0

    attach_backward(poly3, poly_backward_from_ctx, setup_context=setup_context)
    square, cube = poly3(rand(3), 1.0)
    with pytest.raises(KernelDefinitionError, match=r"needs 'x_squared', but setup_context did not keep it"):
        (square.sum() + cube.sum()).backward()


def test_custom_setup_context_with_saved_names_and_unnamed_tensors():
    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def cube4(x: pnex.In("f64", (None,)), alpha: pnex.Scalar("f64"), square: pnex.Out("f64", "x"),
              cube: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            square[i] = alpha * x[i] * x[i]
            cube[i] = x[i] * x[i] * x[i]

    def named(ctx, inputs, output):
        x, alpha = inputs
        ctx.save_for_backward(x * x, x)
        ctx.saved_names = ("x_squared", "x")
        ctx.two_alpha = 2 * alpha

    attach_backward(cube4, poly_backward_from_ctx, setup_context=named)
    assert torch.autograd.gradcheck(lambda x: cube4(x, 0.75), (rand(4),))

    def unnamed(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.two_alpha = 1.0

    attach_backward(cube4, poly_backward_from_ctx, setup_context=unnamed)
    square, cube = cube4(rand(3), 1.0)
    with pytest.raises(KernelDefinitionError, match=r"needs 'x_squared'.*saved 1 tensor\(s\) but named 0"):
        (square.sum() + cube.sum()).backward()


# --------------------------------------------------------------------------------------
# The diffusion step as a functional op: linear and self-adjoint (the 5-point stencil
# with zero boundary is symmetric), so its backward is the same stencil on the gradient.
# --------------------------------------------------------------------------------------


@pnex.jit(n_threads=("u.size(1)", "u.size(0)"), threads_per_block=(4, 4))
def diffuse(u: pnex.In("f64", (None, None)), coeff: pnex.Scalar("f64"), u_new: pnex.Out("f64", "u")):
    col, row = cuda.grid(2)
    rows, cols = u.shape
    if row < rows and col < cols:
        c = u[row, col]
        lap = -4 * c
        if row > 0:
            lap += u[row - 1, col]
        if row + 1 < rows:
            lap += u[row + 1, col]
        if col > 0:
            lap += u[row, col - 1]
        if col + 1 < cols:
            lap += u[row, col + 1]
        u_new[row, col] = c + coeff * lap


@backward_of(diffuse)
@pnex.jit(n_threads=("grad_u_new.size(1)", "grad_u_new.size(0)"), threads_per_block=(4, 4))
def diffuse_backward(
    grad_u_new: pnex.In("f64", (None, None)), coeff: pnex.Scalar("f64"), grad_u: pnex.Out("f64", "grad_u_new")
):
    col, row = cuda.grid(2)
    rows, cols = grad_u_new.shape
    if row < rows and col < cols:
        g = grad_u_new[row, col]
        lap = -4 * g
        if row > 0:
            lap += grad_u_new[row - 1, col]
        if row + 1 < rows:
            lap += grad_u_new[row + 1, col]
        if col > 0:
            lap += grad_u_new[row, col - 1]
        if col + 1 < cols:
            lap += grad_u_new[row, col + 1]
        grad_u[row, col] = g + coeff * lap


def test_diffusion_step_gradcheck():
    assert torch.autograd.gradcheck(lambda u: diffuse(u, 0.2), (rand(5, 6),))


def test_diffusion_matches_workloads_reference():
    u = rand(5, 7, requires_grad=False)
    torch.testing.assert_close(diffuse(u, 0.25), workloads.reference_diffusion(u, 1, 0.25))


def test_diffusion_opcheck():
    torch.library.opcheck(diffuse, (rand(4, 5), 0.1))


# --------------------------------------------------------------------------------------
# The LLTM's fused kernels (benchmarks/workloads.py), in float64.
# --------------------------------------------------------------------------------------

LLTM64 = workloads.lltm_ops(F64)


def test_lltm_forward_matches_torch():
    gates, old_cell = rand(3, 12, requires_grad=False), rand(3, 4, requires_grad=False)
    for got, expected in zip(LLTM64.forward(gates, old_cell), workloads.lltm_cell_reference(gates, old_cell)):
        torch.testing.assert_close(got, expected)


def test_lltm_backward_matches_tutorial_formulas_and_autograd():
    gates, old_cell = rand(3, 15), rand(3, 5)
    grad_h, grad_c = rand(3, 5, requires_grad=False), rand(3, 5, requires_grad=False)
    new_h, new_cell = workloads.lltm_cell_reference(gates, old_cell)
    by_autograd = torch.autograd.grad((new_h, new_cell), (gates, old_cell), (grad_h, grad_c))
    by_formulas = workloads.lltm_cell_backward_reference(grad_h, grad_c, gates.detach(), new_cell.detach())
    by_kernel = LLTM64.backward(grad_h, grad_c, gates.detach(), new_cell.detach())
    for a, b, c in zip(by_autograd, by_formulas, by_kernel):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)


def test_lltm_gradcheck():
    gates, old_cell = rand(2, 9), rand(2, 3)
    assert torch.autograd.gradcheck(LLTM64.forward, (gates, old_cell))


def test_lltm_opcheck():
    torch.library.opcheck(LLTM64.forward, (rand(2, 6), rand(2, 2)))


def test_lltm_module_grads_match_tutorial():
    batch, features, state = 3, 4, 5
    ref = workloads.LLTM(features, state).double()
    mine = workloads.LLTMPnex(features, state).double()
    mine.load_state_dict(ref.state_dict())
    X, h, C = (rand(batch, n, requires_grad=False) for n in (features, state, state))
    for model in (ref, mine):
        new_h, new_C = model(X, (h, C))
        (new_h.sum() + 2 * new_C.sum()).backward()
    torch.testing.assert_close(mine.weights.grad, ref.weights.grad)
    torch.testing.assert_close(mine.bias.grad, ref.bias.grad)


def test_lltm_training_decreases_loss():
    torch.manual_seed(1)
    model, teacher = workloads.LLTMPnex(3, 4).double(), workloads.LLTM(3, 4).double()
    losses = workloads.train_lltm(model, teacher, steps=4, seq_len=2, batch=2)
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_lltm_torch_compile_backward():
    torch.manual_seed(2)
    ref = workloads.LLTM(3, 4).double()
    mine = workloads.LLTMPnex(3, 4).double()
    mine.load_state_dict(ref.state_dict())
    X, h, C = rand(2, 3, requires_grad=False), rand(2, 4), rand(2, 4)

    def loss(model, X, h, C):
        new_h, new_C = model(X, (h, C))
        return new_h.sum() + new_C.pow(2).sum()

    compiled = torch.compile(loss, fullgraph=True)
    compiled(mine, X, h, C).backward()
    grads = [mine.weights.grad, mine.bias.grad, h.grad, C.grad]
    h.grad = C.grad = None
    loss(ref, X, h, C).backward()
    for got, expected in zip(grads, [ref.weights.grad, ref.bias.grad, h.grad, C.grad]):
        torch.testing.assert_close(got, expected)


# --------------------------------------------------------------------------------------
# Wiring errors, reported when the backward is attached.
# --------------------------------------------------------------------------------------


def _op(fn, n_threads="x.numel()"):
    return pnex.jit(n_threads=n_threads, threads_per_block=32)(fn)


@pnex.jit(n_threads="x.numel()", threads_per_block=32)
def scale(
    x: pnex.In("f64", (None,)),
    w: pnex.In("f64", "x"),
    k: pnex.Scalar("f64"),
    idx: pnex.In("i64", "x"),
    y: pnex.Out("f64", "x"),
):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * w[i] * k + idx[i]


def test_backward_argument_that_matches_nothing():
    def bad(grad_y: pnex.In("f64", (None,)), z: pnex.In("f64", "grad_y"), grad_x: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'z' matches nothing: forward 'scale' has arguments \(x, w, k, idx\)"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_gradient_of_an_input_declared_as_argument():
    def bad(grad_y: pnex.In("f64", (None,)), grad_x: pnex.In("f64", "grad_y"), grad_w: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"grad_x names the gradient of forward argument 'x'.*declare it Out"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_gradient_of_a_scalar():
    def bad(grad_y: pnex.In("f64", (None,)), grad_k: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"output 'grad_k': forward argument 'k' is a scalar"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_gradient_of_an_integer_tensor():
    def bad(grad_y: pnex.In("f64", (None,)), grad_idx: pnex.Out("i64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"'idx' is a int64 tensor; only floating-point"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_gradient_of_nothing():
    def bad(grad_y: pnex.In("f64", (None,)), grad_q: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"output 'grad_q': backward outputs must be named grad_<argument>.*grad_x, grad_w, grad_idx"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_output_gradient_declared_as_output():
    def bad(x: pnex.In("f64", (None,)), grad_y: pnex.Out("f64", "x")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"grad_y is the incoming gradient of forward output 'y'; declare it In"):
        attach_backward(scale, _op(bad))


def test_saved_tensor_dtype_mismatch():
    def bad(grad_y: pnex.In("f64", (None,)), w: pnex.In("f32", "grad_y"), grad_x: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'w': is a float32 tensor.*forward 'scale''s 'w' is a float64"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_incoming_gradient_rank_mismatch():
    def bad(grad_y: pnex.In("f64", (None, None)), grad_x: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'grad_y': receives the gradient of forward output 'y'"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_scalar_declared_as_tensor():
    def bad(grad_y: pnex.In("f64", (None,)), k: pnex.In("f64", "grad_y"), grad_x: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"parameter 'k': is a float64 tensor .* but forward 'scale''s 'k' is a float64 scalar"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))


def test_backward_without_gradients():
    def bad(grad_y: pnex.In("f64", (None,)), out: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"output 'out': backward outputs must be named grad_<argument>"):
        attach_backward(scale, _op(bad, "grad_y.numel()"))

    def nothing(grad_y: pnex.InMut("f64", (None,))):
        pass

    with pytest.raises(KernelDefinitionError, match=r"backward kernel 'nothing' mutates 'grad_y' \(InMut\)"):
        attach_backward(scale, _op(nothing, "grad_y.numel()"))


def test_forward_that_mutates():
    def fwd(x: pnex.InMut("f64", (None,)), y: pnex.Out("f64", "x")):
        pass

    def bwd(grad_y: pnex.In("f64", (None,)), grad_x: pnex.Out("f64", "grad_y")):
        pass

    with pytest.raises(KernelDefinitionError, match=r"forward kernel 'fwd' mutates 'x' \(InMut\); PyTorch only differentiates functional ops"):
        attach_backward(_op(fwd), _op(bwd, "grad_y.numel()"))


def test_not_a_pnex_op():
    with pytest.raises(KernelDefinitionError, match=r"the backward must be an op made by pnex.jit or %%pnex"):
        attach_backward(scale, lambda g: g)
    with pytest.raises(KernelDefinitionError, match=r"the forward must be an op made by pnex.jit"):
        backward_of(torch.sin)


def test_gradient_with_the_wrong_shape_at_call_time():
    @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    def double(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = 2 * x[i]

    @pnex.jit(n_threads="grad_x.numel()", threads_per_block=32)
    def double_backward(grad_y: pnex.In("f64", (None,)), grad_x: pnex.Out("f64", ("grad_y.size(0) - 1",))):
        i = cuda.grid(1)
        if i < grad_x.shape[0]:
            grad_x[i] = 2 * grad_y[i]

    attach_backward(double, double_backward)
    with pytest.raises(ArgumentShapeError, match=r"returned 'grad_x' with shape \(3,\), but forward argument 'x' has shape \(4,\)"):
        double(rand(4)).sum().backward()


# --------------------------------------------------------------------------------------
# On a GPU: the same gradients in float64 (skipped without one).
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gradcheck_on_gpu():
    a, b = rand(1000).cuda().detach().requires_grad_(), rand(1000).cuda().detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: muladd(a, b, 0.5), (a, b), fast_mode=True)
    gates, old_cell = rand(16, 3 * 40).cuda().detach().requires_grad_(), rand(16, 40).cuda().detach().requires_grad_()
    assert torch.autograd.gradcheck(LLTM64.forward, (gates, old_cell), fast_mode=True)
    assert torch.autograd.gradcheck(LLTM64.forward, (gates[:2, :6].detach().requires_grad_(),
                                                      old_cell[:2, :2].detach().requires_grad_()))
    assert torch.autograd.gradcheck(lambda u: diffuse(u, 0.2), (rand(33, 17).cuda().detach().requires_grad_(),),
                                    fast_mode=True)


@pytest.mark.gpu
def test_opcheck_and_compile_on_gpu():
    torch.library.opcheck(LLTM64.forward, (rand(4, 24).cuda().detach().requires_grad_(),
                                           rand(4, 8).cuda().detach().requires_grad_()))
    model = workloads.LLTMPnex(32, 128).cuda()
    ref = workloads.LLTM(32, 128).cuda()
    ref.load_state_dict(model.state_dict())
    X, h, C = (torch.randn(16, n, device="cuda") for n in (32, 128, 128))

    def loss(m):
        new_h, new_C = m(X, (h, C))
        return new_h.sum() + new_C.sum()

    torch.compile(loss, fullgraph=True)(model).backward()
    loss(ref).backward()
    torch.testing.assert_close(model.weights.grad, ref.weights.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-4)
