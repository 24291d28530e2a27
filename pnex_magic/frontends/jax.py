"""JAX front end: a pnex op as a function of ``jax.Array``s, eager and under ``jax.jit``.

``pnex_magic.jax_op(op)`` takes the op's arguments in the same order (``In`` and
``InMut`` arrays, ``Scalar`` Python numbers) and returns the ``Out`` arrays like the
PyTorch op, followed by the new values of the ``InMut`` arguments (JAX arrays are
immutable): one array, a tuple of them, or ``None`` when the kernel writes nothing.

What runs where
---------------
* **Trace time** (once per shapes and scalar values; eager calls are traced and
  cached too, through an inner ``jax.jit``): the arguments are checked by the core,
  :func:`pnex_magic.calls.launch_info` on ``torch.empty(..., device="meta")`` stand-ins
  of the arrays, so wrong dtypes, ranks and sizes raise the same exceptions with the
  same messages as the PyTorch op; output shapes, ``n_threads`` and the grid come
  from there too and are fixed in the trace.  Scalars must be concrete Python
  numbers: under ``jax.jit``, mark them static (``static_argnums``) or bind them with
  ``functools.partial``.
* **On a GPU** (the ``cuda`` platform): ``jax.ffi.ffi_call`` of pnex's one XLA FFI
  handler (:mod:`pnex_magic.launch.xla`), which launches the kernel's cubin on XLA's
  stream, with XLA's buffers, on whichever device the computation runs.  ``InMut``
  arguments become ``input_output_aliases``; an ``Out(init=...)`` is a ``jnp.full``
  operand aliased to that output.
* **Elsewhere** (the CPU backend, CI): ``jax.pure_callback`` runs the same kernel
  through numba-cuda's CUDA simulator on CPU tensors.  ``jax.lax.platform_dependent``
  picks the branch when the function is lowered, so one jitted function serves both.
* **vmap**: both branches use ``vmap_method="sequential"``: a kernel knows nothing of
  a batch axis, so a batch runs as one launch per element (a ``lax.map``).
* **Gradients**: the function is a ``jax.custom_vjp``.  The backward pnex op attached
  with :func:`pnex_magic.attach_backward` runs as its VJP, wired by name exactly as
  in PyTorch; without one, ``jax.grad`` raises a clear error.  Forward-mode (``jvp``)
  is not available, as for any ``custom_vjp``.

Errors at run time (a kernel that faults; the simulator's exceptions) surface as
JAX's runtime error carrying pnex's message.  A jitted function keeps the kernel it
was traced with: after redefining a kernel, call ``jax.jit`` again.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pnex_magic's JAX front end needs JAX: pip install 'pnex_magic[jax]' (CPU), or JAX with its CUDA "
        "plugin on a GPU machine (pip install 'jax[cuda13]')"
    ) from exc
import numpy as np
import torch

from .. import autograd
from ..calls import LaunchInfo, launch_info
from ..definition import KernelDefinition
from ..errors import ArgumentShapeError, ArgumentTypeError, KernelCompileError, KernelDefinitionError
from ..launch import launcher_for, xla
from ..op import PnexOp
from ..spec import KernelSpec, ScalarParam, TensorParam

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
        fn = self._function(definition, tuple(scalars))
        results = fn(*arrays)
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _function(self, definition: KernelDefinition, scalars: tuple) -> Any:
        """The jitted function of the arrays for this definition and these scalars."""
        spec = definition.spec
        scalar_params = [p for p in spec.arguments if isinstance(p, ScalarParam)]
        values = dict(zip((p.name for p in scalar_params), scalars))
        slots = tuple(xla.scalar_slots(spec, values))
        key = (definition, slots)  # the bits a launch passes: 0.0 and -0.0 differ, 1 and True do not
        fn = self._traced.get(key)
        if fn is not None:
            self._traced.move_to_end(key)
        else:
            fn = jax.jit(_differentiable(self, definition, values, slots))
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


# ---------------------------------------------------------------------------- checks


def _torch_dtype(dtype: Any) -> torch.dtype | None:
    found = getattr(torch, np.dtype(dtype).name, None)
    return found if isinstance(found, torch.dtype) else None


def _x64() -> bool:
    """Whether JAX makes 64-bit arrays here (``jax_enable_x64``, or a local override)."""
    try:
        return jax.dtypes.canonicalize_dtype(np.int64) == np.dtype(np.int64)
    except AttributeError:  # a JAX without jax.dtypes.canonicalize_dtype
        return bool(jax.config.read("jax_enable_x64"))


def _x64_hint(p: TensorParam) -> str:
    if p.dtype.itemsize == 8 and not _x64():
        return (
            ". JAX makes 32-bit arrays unless 64-bit types are enabled: "
            "jax.config.update('jax_enable_x64', True)"
        )
    return ""


def check_call(spec: KernelSpec, arrays: Sequence[Any], scalars: dict[str, Any]) -> LaunchInfo:
    """The PyTorch op's checks, output shapes and grid for arrays (or abstract values)
    of these shapes and dtypes, through meta-tensor stand-ins."""
    tensors = iter(arrays)
    args = []
    for p in spec.arguments:
        if isinstance(p, ScalarParam):
            args.append(scalars[p.name])
            continue
        array = next(tensors)
        dtype = _torch_dtype(array.dtype)
        if dtype is None:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a {p.dtype.name} tensor, got {np.dtype(array.dtype).name}"
            )
        args.append(torch.empty(tuple(array.shape), dtype=dtype, device="meta"))
    try:
        info = launch_info(spec, args)
    except ArgumentTypeError as exc:
        p = next((q for q in spec.arguments if f"argument {q.name!r} must be a" in str(exc)), None)
        hint = _x64_hint(p) if isinstance(p, TensorParam) else ""
        if hint:
            raise ArgumentTypeError(f"{exc}{hint}") from None
        raise
    for axis, blocks in enumerate(info.grid):
        if blocks > (2**31 - 1 if axis == 0 else 65535):  # as the C++ launcher checks
            raise ArgumentShapeError(
                f"{spec.name}(): the launch needs {blocks} blocks on axis {axis}, more than CUDA allows"
            )
    for p in spec.outputs:
        if p.dtype.itemsize == 8 and not _x64():
            raise ArgumentTypeError(
                f"{spec.name}(): output {p.name!r} is {p.dtype.name}, which JAX makes only with 64-bit types "
                f"enabled: jax.config.update('jax_enable_x64', True)"
            )
    return info


# ---------------------------------------------------------------------------- running


@functools.lru_cache(maxsize=1)
def _cuda_archs() -> tuple[str, ...]:
    """The architectures of the GPUs JAX sees (none without a CUDA backend)."""
    try:
        devices = jax.devices("cuda")
    except RuntimeError:
        return ()
    return tuple(sorted({str(d.compute_capability) for d in devices if getattr(d, "compute_capability", None)}))


def _to_torch(array: np.ndarray) -> torch.Tensor:
    array = np.array(array)  # a writable copy: XLA's buffers are read-only
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
    return tensor.numpy()


def _simulate(definition: KernelDefinition, layout: xla.CallLayout, info: LaunchInfo, scalars: dict[str, Any],
              *operands: np.ndarray) -> tuple[np.ndarray, ...]:
    """The CPU branch (a ``pure_callback``): the kernel in the CUDA simulator."""
    spec = definition.spec
    env: dict[str, Any] = {name: _to_torch(a) for name, a in zip(layout.operands, operands)}
    env.update(scalars)
    for p, shape in zip(spec.outputs, info.output_shapes):
        if p.name not in env:
            env[p.name] = torch.empty(shape, dtype=p.dtype.torch)
    cpu = torch.device("cpu")
    launcher_for(cpu).launch(definition, [env.get(p.name) for p in spec.params], info.grid, info.block, cpu)
    return tuple(_to_numpy(env[name]) for name in layout.results)


def _kernel_id(definition: KernelDefinition) -> int:
    archs = _cuda_archs()
    if not archs:
        return 0  # no CUDA backend: this branch is never lowered
    if not definition.compiles:
        raise KernelCompileError(
            f"kernel {definition.spec.name!r} was not compiled ({definition.toolchain_error}), so it cannot run "
            f"on a GPU from JAX; install numba-cuda[cu12] or numba-cuda[cu13]"
        )
    return xla.register_kernel(definition, archs, verbose=definition.options.verbose)


def run(definition: KernelDefinition, arrays: Sequence[Any], scalars: dict[str, Any], slots: Sequence[int]) -> tuple:
    """Trace one launch of ``definition``: every result (Out arrays, then InMut arrays)."""
    spec = definition.spec
    info = check_call(spec, arrays, scalars)
    layout = xla.call_layout(spec)
    env = dict(zip((p.name for p in spec.arguments if isinstance(p, TensorParam)), arrays))
    for p, shape in zip(spec.outputs, info.output_shapes):
        if p.init is not None:
            env[p.name] = jnp.full(shape, p.init, dtype=jnp.dtype(p.dtype.name))
        else:
            env[p.name] = jax.ShapeDtypeStruct(shape, jnp.dtype(p.dtype.name))
    types = [jax.ShapeDtypeStruct(tuple(env[n].shape), jnp.dtype(spec.param(n).dtype.name)) for n in layout.results]
    if not types:
        return ()
    if 0 in info.grid:  # nothing to launch: Outs are their init (or zeros), InMuts unchanged
        return tuple(
            env[n] if isinstance(env[n], jax.Array) else jnp.zeros(t.shape, t.dtype)
            for n, t in zip(layout.results, types)
        )
    operands = [env[n] for n in layout.operands]

    def gpu(*operands):
        call = jax.ffi.ffi_call(
            xla.TARGET, types, vmap_method="sequential", input_output_aliases=dict(layout.aliases)
        )
        return tuple(call(
            *operands,
            kernel=np.int64(_kernel_id(definition)),
            grid=np.array(info.grid, dtype=np.int64),
            block=np.array(info.block, dtype=np.int64),
            scalars=np.array(slots, dtype=np.int64),
        ))

    def simulated(*operands):
        def callback(*host):
            return _simulate(definition, layout, info, scalars, *host)

        return tuple(jax.pure_callback(callback, tuple(types), *operands, vmap_method="sequential"))

    return tuple(jax.lax.platform_dependent(*operands, cuda=gpu, default=simulated))


# ---------------------------------------------------------------------------- gradients


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Static:
    """A residual that is not an array (the arguments' shapes): kept in the pytree's
    structure, so JAX passes it to the backward rule unchanged."""

    value: Any


def _differentiable(owner: JaxOp, definition: KernelDefinition, scalars: dict[str, Any], slots: tuple) -> Any:
    """``run`` for these scalars as a ``jax.custom_vjp`` of the tensor arguments, whose
    VJP is the backward pnex op attached to ``owner.op``."""
    spec = definition.spec
    names = [p.name for p in spec.arguments if isinstance(p, TensorParam)]

    @jax.custom_vjp
    def forward(*arrays):
        return run(definition, arrays, scalars, slots)

    def forward_with_residuals(*arrays):
        attached = _attached(owner.op)
        results = run(definition, arrays, scalars, slots)
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
        for out, index, g in zip(attached.backward.spec.outputs, plan.grad_targets,
                                 result if isinstance(result, tuple) else (result,)):
            arg = spec.arguments[index].name
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
