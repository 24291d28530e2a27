"""JAX front end: a pnex op as a function of ``jax.Array``s, eager and under ``jax.jit``.

``pnex_magic.jax_op(op)`` takes the op's arguments in the same order (``In`` and
``InMut`` arrays, ``Scalar`` Python numbers) and returns the ``Out`` arrays like the
PyTorch op, followed by the new values of the ``InMut`` arguments (JAX arrays are
immutable): one array, a tuple of them, or ``None`` when the kernel writes nothing.

A call is traced once per shapes and scalar values (eager calls too, through an
inner ``jax.jit``) into one launch of the ``pnex_launch`` primitive, whose
lowerings, checks and block choice :mod:`pnex_magic.frontends.jax` holds (what runs
where: an XLA FFI call on a GPU, the CUDA simulator elsewhere).  Scalars must be
concrete Python numbers: under ``jax.jit``, mark them static (``static_argnums``) or
bind them with ``functools.partial``.

* **Gradients**: the function is a ``jax.custom_vjp``.  The backward pnex op attached
  with :func:`pnex_magic.attach_backward` runs as its VJP, wired by name exactly as
  in PyTorch; without one, ``jax.grad`` raises a clear error.  Forward-mode (``jvp``)
  is not available, as for any ``custom_vjp``.
* **vmap**: a kernel knows nothing of a batch axis, so a batch runs as one launch
  per element (a ``lax.map``).

Loops
-----
A ``lax.fori_loop`` (or ``scan``) whose carry is an ``InMut`` ping-pong pair must keep
each buffer in its own slot: two steps per iteration, ``s = step(u, s); u = step(s,
u)``, carrying ``(u, s)``.  The swapped carry ``(step(u, s), u)`` moves every buffer to
the other slot each iteration, and XLA copies both (four copies per step).  The same
holds for an ``Out`` kernel: ``u = step(step(u))`` per iteration needs no copy, one
step per iteration one.

Errors at run time (a kernel that faults; the simulator's exceptions) surface as
JAX's runtime error carrying pnex's message.  A jitted function keeps the kernel it
was traced with: after redefining a kernel, call ``jax.jit`` again.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

# First: without JAX, pnex_magic.frontends.jax raises an ImportError that says how to install it.
from .jax import LaunchChoice, eager_choice, run

import jax  # noqa: E402 - after the import above, which explains a missing JAX
import numpy as np  # noqa: E402
import torch  # noqa: E402

from .. import autograd  # noqa: E402
from ..definition import KernelDefinition  # noqa: E402
from ..errors import ArgumentShapeError, ArgumentTypeError, KernelDefinitionError  # noqa: E402
from ..launch import xla  # noqa: E402
from ..op import PnexOp  # noqa: E402
from ..spec import KernelSpec, ScalarParam, TensorParam  # noqa: E402

__all__ = ["JaxOp", "jax_op"]

_CACHE_SIZE = 64  # traced functions kept per op: (definition, scalar values) pairs


def jax_op(op: PnexOp) -> JaxOp:
    """The JAX function of a pnex op (see the module docstring)."""
    return JaxOp(op)


class JaxOp:
    """A pnex op as a JAX function: ``f = pnex.jax_op(op); y = f(x, 0.5)``.

    ``op`` is the PyTorch op it was made from.  Calls follow the op: a re-definition
    of the kernel with the same signature is picked up by later traces.
    """

    def __init__(self, op: PnexOp):
        if not isinstance(op, PnexOp):
            raise KernelDefinitionError(f"jax_op() expects an op made by pnex.jit or %%pnex, got {op!r}")
        if op.spec.seeds:
            names = ", ".join(p.name for p in op.spec.seeds)
            raise KernelDefinitionError(
                f"jax_op(): kernel {op.spec.name!r} has Seed parameter(s) ({names}), which each call draws from "
                f"PyTorch's generator; JAX functions are pure, so a JAX function cannot draw them. Pass the seed "
                f"explicitly instead (e.g. `seed: In('u64', (1,))` from jax.random.bits, or an integer Scalar): "
                f"pnex.random's functions take either"
            )
        self.op = op
        self._traced: collections.OrderedDict[tuple, Any] = collections.OrderedDict()

    @property
    def spec(self) -> KernelSpec:
        return self.op.spec

    def signature(self) -> str:
        """The function's signature: the op's arguments as arrays, and its results
        (the ``Out`` arrays, then the new values of the ``InMut`` arguments)."""
        spec = self.spec

        def array(p: TensorParam) -> str:
            return f"Array[{p.dtype.name}, {p.shape_text()}]"

        args = ", ".join(
            f"{p.name}: {p.dtype.python_type.__name__ if isinstance(p, ScalarParam) else array(p)}"
            for p in spec.arguments
        )
        results = [array(p) for p in spec.outputs]
        results += [f"{array(p)} (new {p.name})" for p in spec.arguments if p.role == "inmut"]
        returns = "None" if not results else results[0] if len(results) == 1 else f"tuple[{', '.join(results)}]"
        return f"{spec.name}({args}) -> {returns}"

    def __repr__(self) -> str:
        return f"<pnex JAX function {self.signature()}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self.op
        if op._superseded is not None:
            raise op._superseded.error(op.spec.name)
        if kwargs or len(args) != op._nargs:
            args = op._bind_call(args, kwargs)
        definition = op.definition
        spec = definition.spec
        arrays, scalars = [], []
        for p, value in zip(spec.arguments, args):
            if isinstance(p, TensorParam):
                if not isinstance(value, (jax.Array, np.ndarray)):
                    raise ArgumentTypeError(
                        f"{spec.name}(): argument {p.name!r} must be a jax.Array ({p.describe()}), "
                        f"got {type(value).__name__}"
                    )
                arrays.append(value)
            else:
                scalars.append(_static_scalar(spec, p, value))
        # The PyTorch op's own checks of the scalars' kinds (meta tensors stand in for arrays).
        placeholder = torch.empty(0, device="meta")
        given = iter(scalars)
        op._check_types(tuple(placeholder if isinstance(p, TensorParam) else next(given) for p in spec.arguments))
        values = dict(zip((p.name for p in spec.arguments if isinstance(p, ScalarParam)), scalars))
        choice = eager_choice(op, arrays, values)
        fn = self._function(definition, tuple(scalars), choice)
        results = fn(*arrays)
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _function(self, definition: KernelDefinition, scalars: tuple, choice: LaunchChoice | None = None) -> Any:
        """The jitted function of the arrays for this definition, these scalars and
        this block shape (``None``: the choice stored for each traced key, else the
        first candidate)."""
        spec = definition.spec
        scalar_params = [p for p in spec.arguments if isinstance(p, ScalarParam)]
        values = dict(zip((p.name for p in scalar_params), scalars))
        slots = tuple(xla.scalar_slots(spec, values))
        key = (definition, slots, choice)  # the bits a launch passes: 0.0 and -0.0 differ, 1 and True do not
        fn = self._traced.get(key)
        if fn is not None:
            self._traced.move_to_end(key)
        else:
            fn = jax.jit(_differentiable(self, definition, values, slots, choice))
            self._traced[key] = fn
            while len(self._traced) > _CACHE_SIZE:
                self._traced.popitem(last=False)
        return fn


def _static_scalar(spec: KernelSpec, p: ScalarParam, value: Any) -> Any:
    if isinstance(value, jax.Array):
        raise ArgumentTypeError(
            f"{spec.name}(): argument {p.name!r} is a {p.describe()}: pass a Python "
            f"{p.dtype.python_type.__name__}, not a jax.Array. Scalars are fixed when the function is traced; "
            f"under jax.jit, mark the argument static (static_argnums=... / static_argnames=...) or bind it "
            f"with functools.partial"
        )
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------- gradients


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Static:
    """A residual that is not an array (the arguments' shapes): kept in the pytree's
    structure, so JAX passes it to the backward rule unchanged."""

    value: Any


def _differentiable(owner: JaxOp, definition: KernelDefinition, scalars: dict[str, Any], slots: tuple,
                    choice: LaunchChoice | None = None) -> Any:
    """``run`` for these scalars as a ``jax.custom_vjp`` of the tensor arguments, whose
    VJP is the backward pnex op attached to ``owner.op``."""
    spec = definition.spec
    names = [p.name for p in spec.arguments if isinstance(p, TensorParam)]

    @jax.custom_vjp
    def forward(*arrays):
        return run(definition, arrays, scalars, slots, choice)

    def forward_with_residuals(*arrays):
        attached = _attached(owner.op)
        results = run(definition, arrays, scalars, slots, choice)
        env = dict(zip(names, arrays))
        env.update(zip((p.name for p in spec.outputs), results))
        saved = tuple(env[n] for n in attached.plan.saved_tensors)
        return results, (saved, _Static(tuple(tuple(a.shape) for a in arrays)))

    def backward(residuals, cotangents):
        attached = _attached(owner.op)
        plan = attached.plan
        saved, static = residuals
        shapes = static.value
        named = dict(zip(plan.saved_tensors, saved))
        args = []
        for source in plan.sources:
            if source.kind == "grad":
                args.append(cotangents[source.index])
            elif source.is_tensor:
                args.append(named[source.target])
            else:
                args.append(scalars[source.target])
        result = JaxOp(attached.backward)(*args)
        grads: list[Any] = [None] * len(names)
        for out, index, cast, g in zip(attached.backward.spec.outputs, plan.grad_targets, plan.grad_casts,
                                       result if isinstance(result, tuple) else (result,)):
            arg = spec.arguments[index].name
            if cast is not None:  # a float32 gradient of a float16/bfloat16 argument
                g = g.astype(spec.arguments[index].dtype.name)
            slot = names.index(arg)
            if tuple(g.shape) != shapes[slot]:
                raise ArgumentShapeError(
                    f"backward of {spec.name!r}: {plan.backward!r} returned {out.name!r} with shape "
                    f"{tuple(g.shape)}, but forward argument {arg!r} has shape {shapes[slot]}; "
                    f"declare it Out(..., {arg!r}) or with {arg!r}'s sizes"
                )
            grads[slot] = g
        return tuple(grads)

    forward.defvjp(forward_with_residuals, backward)
    return forward


def _attached(op: PnexOp) -> autograd.Attached:
    name = op.spec.name
    attached = autograd.attached_backward(op)
    if attached is None:
        extra = ""
        if getattr(op, "_backward_fn", None) is not None:
            extra = "; its PyTorch autograd formula (register_autograd) cannot run in JAX"
        raise KernelDefinitionError(
            f"{name}(): JAX can only differentiate a pnex op through a backward pnex op: attach one with "
            f"pnex.attach_backward({name}, {name}_backward) or @pnex.backward_of({name}){extra}"
        )
    if attached.custom_context:
        raise KernelDefinitionError(
            f"{name}(): its backward {attached.plan.backward!r} was attached with a custom setup_context, which "
            f"fills a PyTorch autograd ctx and cannot run in JAX; attach it without setup_context (the backward "
            f"kernel's parameters matched by name) to differentiate in JAX"
        )
    return attached
