"""Autograd for pnex ops: a backward kernel, itself a pnex op, attached to a forward op.

:func:`attach_backward` (or the decorator :func:`backward_of`, or the magic's
``%%pnex --backward-of FORWARD``) registers the backward op as the forward op's
autograd formula through :meth:`torch.library.CustomOpDef.register_autograd`, so
gradients flow through ``torch.autograd``, ``torch.compile`` and
``torch.library.opcheck``.

The backward kernel's parameters are wired to the forward op **by name**:

=============================  ===============================================
backward parameter             receives / means
=============================  ===============================================
``x`` (``In`` or ``Scalar``)   forward argument ``x`` or forward output ``x``,
                               saved during the forward pass
``grad_y`` (``In``)            the incoming gradient of forward output ``y``
                               (made contiguous; a missing one is zeros)
``grad_x`` (``Out``)           the gradient of forward tensor argument ``x``
=============================  ===============================================

Forward tensor arguments without a ``grad_<name>`` output get no gradient
(``None``), and so do scalars.  For example, for ``y = x * w + c``::

    @pnex.jit(n_threads="x.numel()")
    def scale(x: pnex.In("f32", (None,)), w: pnex.In("f32", "x"), c: float,
              y: pnex.Out("f32", "x")): ...

    @pnex.autograd.backward_of(scale)
    @pnex.jit(n_threads="x.numel()")
    def scale_backward(grad_y: pnex.In("f32", (None,)), x: pnex.In("f32", "grad_y"),
                       w: pnex.In("f32", "grad_y"),
                       grad_x: pnex.Out("f32", "x"), grad_w: pnex.Out("f32", "x")): ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from .errors import ArgumentShapeError, KernelDefinitionError
from .op import ATTACHED as _ATTACHED
from .op import attached_backward
from .op import PnexOp
from .spec import KernelSpec, ScalarParam, TensorParam

__all__ = ["attach_backward", "backward_of", "save_for_backward", "Attached", "attached_backward"]

GRAD_PREFIX = "grad_"

# Attributes pnex keeps on the autograd ctx.  Prefixed so that they cannot clash
# with ctx's own attributes or with what a user's setup_context stores.
_SAVED_NAMES = "pnex_saved_names"
_SCALARS = "pnex_scalars"
_META = "pnex_meta"


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where one backward argument comes from."""

    kind: str  # "saved" (forward argument/output), "grad" (incoming gradient), "ctx" (custom setup_context)
    name: str  # the backward parameter's name
    target: str  # the forward argument/output name ("saved", "grad") or the ctx name ("ctx")
    index: int = -1  # "grad": which forward output
    is_tensor: bool = True


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The name matching between a forward and a backward op, checked once."""

    forward: str
    backward: str
    sources: tuple[_Source, ...]  # one per backward argument, in order
    grad_targets: tuple[int, ...]  # per backward output: index of the forward argument it is the gradient of
    saved_tensors: tuple[str, ...]  # forward tensors the default setup_context saves
    saved_scalars: tuple[str, ...]  # forward scalars the default setup_context keeps
    #: per backward output: the dtype it is cast to (a float32 gradient of a float16/bfloat16
    #: argument, accumulated in float32), or None
    grad_casts: tuple[torch.dtype | None, ...] = ()


@dataclasses.dataclass(frozen=True)
class Attached:
    """What :func:`attach_backward` recorded on a forward op, for front ends that build
    their own autograd from it (JAX's ``custom_vjp``)."""

    backward: PnexOp
    plan: _Plan
    custom_context: bool  #: a custom ``setup_context`` (a PyTorch ctx) feeds the backward


def _check_op(op: Any, role: str) -> KernelSpec:
    spec = getattr(op, "spec", None)
    if not isinstance(op, PnexOp) or not isinstance(spec, KernelSpec):
        raise KernelDefinitionError(
            f"attach_backward(): the {role} must be an op made by pnex.jit or %%pnex, got {op!r}"
        )
    return spec


def _kind(p: TensorParam | ScalarParam) -> str:
    if isinstance(p, ScalarParam):
        return f"a {p.dtype.name} scalar"
    return f"a {p.dtype.name} tensor with {p.ndim} dimension(s)"


def _plan(fspec: KernelSpec, bspec: KernelSpec, *, custom_context: bool) -> _Plan:
    fwd, bwd = fspec.name, bspec.name
    if fspec.mutated:
        raise KernelDefinitionError(
            f"attach_backward(): forward kernel {fwd!r} mutates {', '.join(map(repr, fspec.mutated))} (InMut); "
            f"PyTorch only differentiates functional ops. Declare the results as Out(...) instead of InMut"
        )
    if not fspec.outputs:
        raise KernelDefinitionError(
            f"attach_backward(): forward kernel {fwd!r} has no Out tensors, so there is nothing to differentiate"
        )
    if bspec.mutated:
        raise KernelDefinitionError(
            f"attach_backward(): backward kernel {bwd!r} mutates {', '.join(map(repr, bspec.mutated))} (InMut); "
            f"a backward kernel must not write the tensors saved from the forward pass. Return the gradients "
            f"as Out(...) parameters named grad_<input> (use init=0 to accumulate into them)"
        )
    f_args = {p.name: (i, p) for i, p in enumerate(fspec.arguments)}
    f_outs = {p.name: (i, p) for i, p in enumerate(fspec.outputs)}
    tensor_inputs = [p.name for p in fspec.arguments if isinstance(p, TensorParam)]
    known = (
        f"forward {fwd!r} has arguments ({', '.join(f_args) or 'none'}) and outputs ({', '.join(f_outs)}); "
        f"incoming gradients are named {', '.join(GRAD_PREFIX + n for n in f_outs)}"
    )

    sources: list[_Source] = []
    for p in bspec.arguments:
        where = f"attach_backward(): backward kernel {bwd!r}, parameter {p.name!r}"
        match = f_args.get(p.name) or f_outs.get(p.name)
        if match is not None:
            fp = match[1]
            if isinstance(fp, TensorParam) != isinstance(p, TensorParam):
                raise KernelDefinitionError(
                    f"{where}: is {_kind(p)} but forward {fwd!r}'s {p.name!r} is {_kind(fp)}; "
                    f"declare it as {fp.describe()}"
                )
            if isinstance(fp, TensorParam) and (fp.dtype != p.dtype or fp.ndim != p.ndim):
                raise KernelDefinitionError(
                    f"{where}: is {_kind(p)} but forward {fwd!r}'s {p.name!r} is {_kind(fp)}; "
                    f"the saved tensor is passed as it is, so declare the same dtype and number of dimensions"
                )
            if isinstance(fp, ScalarParam) and fp.dtype.schema_scalar != p.dtype.schema_scalar:
                raise KernelDefinitionError(
                    f"{where}: is {_kind(p)} but forward {fwd!r}'s {p.name!r} is {_kind(fp)}; "
                    f"declare it as Scalar({fp.dtype.name!r})"
                )
            sources.append(_Source("saved", p.name, p.name, is_tensor=isinstance(p, TensorParam)))
            continue
        if p.name.startswith(GRAD_PREFIX) and p.name[len(GRAD_PREFIX):] in f_outs:
            index, fp = f_outs[p.name[len(GRAD_PREFIX):]]
            if not isinstance(p, TensorParam):
                raise KernelDefinitionError(
                    f"{where}: receives the gradient of forward output {fp.name!r}, a tensor; "
                    f"declare it as In({fp.dtype.name!r}, ...) with {fp.ndim} dimension(s), not {p.describe()}"
                )
            if fp.dtype != p.dtype or fp.ndim != p.ndim:
                raise KernelDefinitionError(
                    f"{where}: receives the gradient of forward output {fp.name!r} ({_kind(fp)}) but is "
                    f"declared as {_kind(p)}; a gradient has its output's dtype and shape"
                )
            sources.append(_Source("grad", p.name, fp.name, index=index))
            continue
        if custom_context:
            sources.append(_Source("ctx", p.name, p.name, is_tensor=isinstance(p, TensorParam)))
            continue
        hint = ""
        if p.name.startswith(GRAD_PREFIX) and p.name[len(GRAD_PREFIX):] in f_args:
            hint = (
                f"; {p.name} names the gradient of forward argument {p.name[len(GRAD_PREFIX):]!r}, which the "
                f"backward kernel computes: declare it Out(...), not as an argument"
            )
        raise KernelDefinitionError(
            f"{where} matches nothing: {known}{hint}. (With a custom setup_context, other names are looked "
            f"up on ctx)"
        )

    grad_targets: list[int] = []
    grad_casts: list[torch.dtype | None] = []
    for p in bspec.outputs:
        where = f"attach_backward(): backward kernel {bwd!r}, output {p.name!r}"
        target = p.name[len(GRAD_PREFIX):] if p.name.startswith(GRAD_PREFIX) else None
        if target is None or target not in f_args:
            if target is not None and target in f_outs:
                problem = (
                    f"{p.name} is the incoming gradient of forward output {target!r}; declare it In(...), "
                    f"as an argument of the backward kernel"
                )
            else:
                problem = (
                    f"backward outputs must be named grad_<argument> after a tensor argument of forward "
                    f"{fwd!r} ({', '.join(GRAD_PREFIX + n for n in tensor_inputs) or 'it has none'})"
                )
            raise KernelDefinitionError(f"{where}: {problem}")
        index, fp = f_args[target]
        if isinstance(fp, ScalarParam):
            raise KernelDefinitionError(
                f"{where}: forward argument {target!r} is a scalar; pnex ops return gradients only for "
                f"tensor arguments ({', '.join(tensor_inputs) or 'none'})"
            )
        if not fp.dtype.is_floating_point:
            raise KernelDefinitionError(
                f"{where}: forward argument {target!r} is a {fp.dtype.name} tensor; only floating-point "
                f"tensors have gradients"
            )
        widened = p.dtype.name == "float32" and fp.dtype.name in ("float16", "bfloat16")
        if (fp.dtype != p.dtype and not widened) or fp.ndim != p.ndim:
            raise KernelDefinitionError(
                f"{where}: is the gradient of forward argument {target!r} ({_kind(fp)}) but is declared as "
                f"{_kind(p)}; a gradient has its argument's dtype (or float32 for a float16/bfloat16 argument, "
                f"cast back) and shape"
            )
        grad_targets.append(index)
        grad_casts.append(fp.dtype.torch if widened else None)
    if not grad_targets:
        raise KernelDefinitionError(
            f"attach_backward(): backward kernel {bwd!r} computes no gradients: give it Out parameters named "
            f"grad_<argument> for the tensor arguments of forward {fwd!r} "
            f"({', '.join(GRAD_PREFIX + n for n in tensor_inputs) or 'it has none'})"
        )

    saved_tensors = tuple(s.target for s in sources if s.kind == "saved" and s.is_tensor)
    saved_scalars = tuple(s.target for s in sources if s.kind == "saved" and not s.is_tensor)
    return _Plan(fwd, bwd, tuple(sources), tuple(grad_targets), saved_tensors, saved_scalars, tuple(grad_casts))


def save_for_backward(ctx: Any, **tensors: torch.Tensor) -> None:
    """For a custom ``setup_context``: save tensors under names, so that backward
    parameters of those names receive them.  ``save_for_backward(ctx, x=x, h=h)`` is
    ``ctx.save_for_backward(x, h)`` plus naming them ``x`` and ``h``."""
    ctx.save_for_backward(*tensors.values())
    setattr(ctx, _SAVED_NAMES, tuple(tensors))


def attach_backward(
    forward: PnexOp,
    backward: PnexOp,
    *,
    setup_context: Callable[[Any, tuple, Any], None] | None = None,
) -> None:
    """Make ``backward`` (a pnex op) the autograd formula of ``forward`` (a pnex op).

    The backward op's parameters are matched to the forward op by name:

    * an ``In`` or ``Scalar`` parameter named like a forward argument or output
      receives that value, saved during the forward pass;
    * an ``In`` parameter ``grad_<output>`` receives the incoming gradient of forward
      output ``<output>``, made contiguous (zeros if autograd passes none);
    * each ``Out`` parameter must be named ``grad_<argument>``: it is the gradient of
      that floating-point tensor argument of the forward op, of its dtype (or float32
      for a float16/bfloat16 argument: accumulated in float32, cast back here).  Tensor
      arguments without one get no gradient (``None``), and so do scalars.

    Everything is checked here, up front: a backward parameter that matches nothing,
    a gradient named after a scalar or a missing argument, or a dtype or number of
    dimensions that differs from the forward tensor it stands for raises
    :class:`~pnex_magic.KernelDefinitionError`.  Sizes are checked when the ops run.

    Parameters
    ----------
    forward : PnexOp
        A functional op (no ``InMut`` parameters) with at least one ``Out``.
    backward : PnexOp
        The op that computes the gradients.  It runs inside autograd's backward
        pass, so it is traced by ``torch.compile`` and tested by ``opcheck`` as well.
    setup_context : callable, optional
        ``setup_context(ctx, inputs, output)`` in the style of
        :meth:`torch.library.CustomOpDef.register_autograd`: ``inputs`` are the forward
        op's arguments, ``output`` its result (a tensor or a tuple).  Without one,
        pnex saves exactly the forward tensors the backward op names (with
        ``ctx.save_for_backward``) and the scalars it names.  With one, backward
        parameters that are not ``grad_<output>`` are looked up by name among the
        tensors it saved with :func:`save_for_backward` (or ``ctx.save_for_backward``
        plus ``ctx.saved_names = (...)`` in the same order), then among ``ctx``'s
        attributes; such names need not match the forward op.

    Examples
    --------
    >>> import torch, pnex_magic as pnex
    >>> from numba import cuda
    >>> @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    ... def square(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x")):
    ...     i = cuda.grid(1)
    ...     if i < x.shape[0]:
    ...         y[i] = x[i] * x[i]
    >>> @pnex.jit(n_threads="x.numel()", threads_per_block=32)
    ... def square_backward(grad_y: pnex.In("f64", (None,)), x: pnex.In("f64", "grad_y"),
    ...                     grad_x: pnex.Out("f64", "x")):
    ...     i = cuda.grid(1)
    ...     if i < x.shape[0]:
    ...         grad_x[i] = 2 * x[i] * grad_y[i]
    >>> pnex.autograd.attach_backward(square, square_backward)
    >>> x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    >>> square(x).sum().backward()
    >>> x.grad
    tensor([2., 4., 6.], dtype=torch.float64)
    """
    fspec = _check_op(forward, "forward")
    bspec = _check_op(backward, "backward")
    if setup_context is not None and not callable(setup_context):
        raise KernelDefinitionError(
            f"attach_backward(): setup_context must be a function (ctx, inputs, output), got {setup_context!r}"
        )
    plan = _plan(fspec, bspec, custom_context=setup_context is not None)
    arg_names = tuple(p.name for p in fspec.arguments)
    out_names = tuple(p.name for p in fspec.outputs)
    n_args = len(arg_names)

    def setup(ctx, inputs, output) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        if setup_context is None:
            env = dict(zip(arg_names, inputs))
            env.update(zip(out_names, outputs))
            ctx.save_for_backward(*(env[n] for n in plan.saved_tensors))
            setattr(ctx, _SAVED_NAMES, plan.saved_tensors)
            setattr(ctx, _SCALARS, {n: env[n] for n in plan.saved_scalars})
        else:
            setup_context(ctx, inputs, output)
            if not hasattr(ctx, _SAVED_NAMES):
                setattr(ctx, _SAVED_NAMES, tuple(getattr(ctx, "saved_names", ())))
            # Forward arguments and outputs the user did not save explicitly are
            # still found by name: keep the scalars (cheap, no tensor references).
            setattr(ctx, _SCALARS, {n: v for n, v in zip(arg_names, inputs) if not isinstance(v, torch.Tensor)})
        # Shapes of the arguments that get gradients (checked in backward) and what
        # a missing incoming gradient looks like (zeros of the output's shape).
        setattr(
            ctx,
            _META,
            (
                {i: tuple(inputs[i].shape) for i in plan.grad_targets},
                [(tuple(o.shape), o.dtype, o.device) for o in outputs],
            ),
        )

    def backward_fn(ctx, *grads):
        input_shapes, output_meta = getattr(ctx, _META)
        saved_names = getattr(ctx, _SAVED_NAMES)
        saved = ctx.saved_tensors
        named = dict(zip(saved_names, saved)) if len(saved_names) == len(saved) else {}
        scalars = getattr(ctx, _SCALARS)
        args = []
        for source in plan.sources:
            if source.kind == "grad":
                g = grads[source.index]
                if g is None:
                    shape, dtype, device = output_meta[source.index]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                args.append(g.contiguous())
            elif source.target in named:
                args.append(named[source.target])
            elif source.target in scalars:
                args.append(scalars[source.target])
            elif setup_context is not None and hasattr(ctx, source.target):
                args.append(getattr(ctx, source.target))
            else:
                unnamed = ""
                if len(saved_names) != len(saved):
                    unnamed = (
                        f" (it saved {len(saved)} tensor(s) but named {len(saved_names)}: "
                        f"{', '.join(saved_names) or 'none'})"
                    )
                raise KernelDefinitionError(
                    f"backward of {plan.forward!r}: backward kernel {plan.backward!r} needs {source.name!r}, but "
                    f"setup_context did not keep it{unnamed}: save it with "
                    f"pnex_magic.autograd.save_for_backward(ctx, {source.name}=...) or set ctx.{source.name}"
                )
        result = backward(*args)
        results = result if isinstance(result, tuple) else (result,)
        grad_inputs: list[torch.Tensor | None] = [None] * n_args
        for out_param, index, cast, g in zip(backward.spec.outputs, plan.grad_targets, plan.grad_casts, results):
            expected = input_shapes[index]
            if cast is not None:
                g = g.to(cast)
            if tuple(g.shape) != expected:
                raise ArgumentShapeError(
                    f"backward of {plan.forward!r}: {plan.backward!r} returned {out_param.name!r} with shape "
                    f"{tuple(g.shape)}, but forward argument {arg_names[index]!r} has shape {expected}; "
                    f"declare it Out(..., {arg_names[index]!r}) or with {arg_names[index]!r}'s sizes"
                )
            grad_inputs[index] = g
        return tuple(grad_inputs)

    # Kept on the function torch stores (and a failed re-definition re-registers).
    setattr(backward_fn, _ATTACHED, Attached(backward, plan, setup_context is not None))
    forward.register_autograd(backward_fn, setup_context=setup)


def backward_of(
    forward: PnexOp, *, setup_context: Callable[[Any, tuple, Any], None] | None = None
) -> Callable[[PnexOp], PnexOp]:
    """Decorator form of :func:`attach_backward`; returns the backward op unchanged.

    Above ``@pnex.jit``, with the backward's parameters named as for :func:`attach_backward`::

        @backward_of(square)
        @pnex.jit(n_threads="x.numel()")
        def square_backward(grad_y: ..., x: ..., grad_x: pnex.Out(...)): ...
    """
    _check_op(forward, "forward")

    def decorator(backward: PnexOp) -> PnexOp:
        attach_backward(forward, backward, setup_context=setup_context)
        return backward

    return decorator
