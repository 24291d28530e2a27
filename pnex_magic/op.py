"""Torch-op stage: a kernel definition becomes a ``torch.library`` custom operator.

The operator's schema comes from the spec (``In``/``InMut``/``Scalar`` are
arguments, ``InMut`` marked as mutated, ``Out`` tensors returned).  One Python
implementation serves every device: it checks the arguments, allocates the
outputs on the inputs' device, evaluates the launch grid and hands over to the
launcher for that device.  The fake implementation runs the same checks and
shape expressions on fake tensors, so ``torch.compile(fullgraph=True)`` traces
through calls with symbolic sizes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._library.custom_ops import CustomOpDef

from .definition import KernelDefinition
from .errors import ArgumentShapeError, ArgumentTypeError, KernelLaunchError
from .launch import launcher_for
from .spec import KernelSpec, ScalarParam, TensorParam

__all__ = ["PnexOp", "make_op", "NAMESPACE", "check_arguments", "output_shapes", "launch_grid"]

NAMESPACE = "pnex"


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_arguments(spec: KernelSpec, env: Mapping[str, Any]) -> torch.device | None:
    """Check every tensor argument's dtype, rank, sizes and device against the spec;
    returns the common device (``None`` if there are no tensor arguments)."""
    device: torch.device | None = None
    first: str | None = None
    for p in spec.arguments:
        if not isinstance(p, TensorParam):
            continue
        t = env[p.name]
        if t.dtype != p.dtype.torch:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} must be a {p.dtype.name} tensor, got {str(t.dtype).removeprefix('torch.')}"
            )
        if t.dim() != p.ndim:
            raise ArgumentShapeError(
                f"{spec.name}(): argument {p.name!r} must have {p.ndim} dimension(s) {p.shape_text()}, "
                f"got {t.dim()} with shape {_fmt_shape(t.shape)}"
            )
        if device is None:
            device, first = t.device, p.name
        elif t.device != device:
            raise ArgumentTypeError(
                f"{spec.name}(): argument {p.name!r} is on {t.device} but {first!r} is on {device}; "
                f"all tensor arguments must be on one device"
            )
    for p in spec.arguments:
        if not isinstance(p, TensorParam):
            continue
        t = env[p.name]
        for axis, expr in enumerate(p.shape):
            if expr is None:
                continue
            expected = expr.evaluate(env)
            if t.shape[axis] != expected:
                raise ArgumentShapeError(
                    f"{spec.name}(): argument {p.name!r} must have size {expr} = {expected} on axis {axis}, "
                    f"got {t.shape[axis]} (shape {_fmt_shape(t.shape)})"
                )
    return device


def output_shapes(spec: KernelSpec, env: dict[str, Any]) -> list[tuple[Any, ...]]:
    shapes = []
    for p in spec.outputs:
        shape = tuple(expr.evaluate(env) for expr in p.shape)
        for axis, size in enumerate(shape):
            if isinstance(size, int) and size < 0:
                raise ArgumentShapeError(
                    f"{spec.name}(): output {p.name!r} would have size {p.shape[axis]} = {size} on axis {axis}; "
                    f"sizes cannot be negative"
                )
        shapes.append(shape)
    return shapes


def launch_grid(spec: KernelSpec, env: Mapping[str, Any]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(blocks per grid, threads per block), both padded to three axes."""
    grid = []
    for axis, (expr, tpb) in enumerate(zip(spec.n_threads, spec.threads_per_block)):
        n = int(expr.evaluate(env))
        if n < 0:
            raise ArgumentShapeError(f"{spec.name}(): n_threads[{axis}] = {expr} evaluates to {n}, which is negative")
        grid.append(-(-n // tpb))
    block = list(spec.threads_per_block)
    while len(grid) < 3:
        grid.append(1)
        block.append(1)
    return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])


def _bind(spec: KernelSpec, args: Sequence[Any]) -> dict[str, Any]:
    return {p.name: v for p, v in zip(spec.arguments, args)}


def _allocate(spec: KernelSpec, env: dict[str, Any], device: torch.device, fake: bool) -> list[torch.Tensor]:
    outs = []
    for p, shape in zip(spec.outputs, output_shapes(spec, env)):
        if p.init is None or fake:
            t = torch.empty(shape, dtype=p.dtype.torch, device=device)
        else:
            t = torch.full(shape, p.init, dtype=p.dtype.torch, device=device)
        env[p.name] = t
        outs.append(t)
    return outs


def _result(outs: list[torch.Tensor]) -> Any:
    if not outs:
        return None
    if len(outs) == 1:
        return outs[0]
    return tuple(outs)


def _default_device() -> torch.device:
    return torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")


def make_impl(definition: KernelDefinition):
    spec = definition.spec

    def impl(*args):
        env = _bind(spec, args)
        device = check_arguments(spec, env) or _default_device()
        outs = _allocate(spec, env, device, fake=False)
        grid, block = launch_grid(spec, env)
        if grid[0] and grid[1] and grid[2]:
            values = [env.get(p.name) for p in spec.params]
            launcher_for(device).launch(definition, values, grid, block, device)
        return _result(outs)

    return impl


def make_fake(definition: KernelDefinition):
    spec = definition.spec

    def fake(*args):
        env = _bind(spec, args)
        device = check_arguments(spec, env) or _default_device()
        outs = _allocate(spec, env, device, fake=True)
        return _result(outs)

    return fake


class PnexOp(CustomOpDef):
    """A ``torch.library.CustomOpDef`` made from a pnex kernel.

    Call it like a function: ``In``/``InMut``/``Scalar`` parameters are its
    arguments (positional or by name), ``Out`` tensors its results.  Everything
    ``CustomOpDef`` offers (``register_autograd``, ``register_fake``, ...) works.
    """

    _pnex: KernelDefinition
    _native: bool = False

    def __call__(self, *args, **kwargs):
        if kwargs or len(args) != self._nargs:
            args = self._bind_call(args, kwargs)
        # Kind checks, precomputed per op (make_op) so that a call costs two isinstance()s.
        for i in self._tensor_slots:
            if not isinstance(args[i], torch.Tensor):
                self._check_types(args)
        for i in self._scalar_slots:
            if type(args[i]) is not self._scalar_types[i]:
                self._check_types(args)
        try:
            return self._opoverload(*args)
        except (TypeError, ValueError, RuntimeError) as exc:
            translated = _translate(exc)
            if translated is exc:
                raise
            raise translated from None

    def _check_types(self, args: tuple) -> None:
        """Python-side checks of the arguments' kinds (a tensor where a tensor goes, an
        int where an int goes), so mistakes get a clear message instead of the
        dispatcher's or a failure deep in the implementation."""
        spec = self._pnex.spec
        for p, value in zip(spec.arguments, args):
            if isinstance(p, TensorParam):
                if not isinstance(value, torch.Tensor):
                    raise ArgumentTypeError(
                        f"{spec.name}(): argument {p.name!r} must be a torch.Tensor ({p.describe()}), "
                        f"got {type(value).__name__}"
                    ) from None
            elif isinstance(p, ScalarParam) and not _scalar_ok(p, value):
                raise ArgumentTypeError(
                    f"{spec.name}(): argument {p.name!r} must be a Python {p.dtype.python_type.__name__} "
                    f"({p.describe()}), got {type(value).__name__} {value!r}"
                ) from None

    def register_autograd(self, backward, /, *, setup_context=None) -> None:
        super().register_autograd(backward, setup_context=setup_context)
        if self._native:
            # The C++ launcher installed a C++ "not implemented" autograd kernel so that
            # calls run no Python; a formula now exists: swap in CustomOpDef's autograd kernel.
            from .launch import native

            native.drop_autograd_fallback(self._pnex)
            if not torch._C._dispatch_has_kernel_for_dispatch_key(self._qualname, "Autograd"):
                from torch._library import autograd as _autograd

                self._lib.impl(self._name, _autograd.make_autograd_impl(self._opoverload, self), "Autograd", with_keyset=True)

    def _register_autograd_dispatcher_impl(self) -> None:
        # With the C++ launcher, autograd and ADInplaceOrView kernels are C++ (registered
        # by the launcher); CustomOpDef's Python ones would run on every call.
        if not self._native:
            super()._register_autograd_dispatcher_impl()

    def _register_adinplaceorview_dispatcher_impl(self) -> None:
        if not self._native:
            super()._register_adinplaceorview_dispatcher_impl()

    def _bind_call(self, args: tuple, kwargs: dict) -> tuple:
        spec = self._pnex.spec
        arguments = spec.arguments
        names = [p.name for p in arguments]
        outputs = {p.name for p in spec.outputs}
        for key in kwargs:
            if key in outputs:
                raise ArgumentTypeError(
                    f"{spec.name}(): {key!r} is an Out parameter: the op creates and returns it, so do not pass it"
                )
            if key not in names:
                raise ArgumentTypeError(
                    f"{spec.name}() got an unexpected keyword argument {key!r}; its arguments are ({', '.join(names)})"
                )
        if len(args) > len(arguments):
            extra = ""
            if len(args) <= len(arguments) + len(spec.outputs):
                extra = (
                    f"; Out parameters ({', '.join(p.name for p in spec.outputs)}) are returned by the op, not passed"
                )
            raise ArgumentTypeError(
                f"{spec.name}() takes {len(arguments)} argument(s) ({', '.join(names)}) but {len(args)} were given{extra}"
            )
        for key in kwargs:
            if names.index(key) < len(args):
                raise ArgumentTypeError(f"{spec.name}() got multiple values for argument {key!r}")
        bound = list(args)
        for p in arguments[len(args):]:
            if p.name not in kwargs:
                missing = [q.name for q in arguments[len(bound):] if q.name not in kwargs]
                raise ArgumentTypeError(
                    f"{spec.name}() is missing argument(s) {', '.join(map(repr, missing))}; "
                    f"it takes ({', '.join(names)})"
                )
            bound.append(kwargs[p.name])
        return tuple(bound)

    @property
    def definition(self) -> KernelDefinition:
        return self._pnex

    @property
    def spec(self) -> KernelSpec:
        return self._pnex.spec

    def __repr__(self) -> str:
        return f"<pnex op {NAMESPACE}::{self._pnex.op_name}: {self._pnex.spec.python_signature()}>"


def _scalar_ok(p: ScalarParam, value: Any) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if p.dtype.schema_scalar == "bool":
        return isinstance(value, bool)
    if p.dtype.schema_scalar == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def make_op(definition: KernelDefinition) -> PnexOp:
    """Register ``definition`` as ``torch.ops.pnex.<name>``; a definition with the
    same name (a re-run cell) replaces the previous registration."""
    spec = definition.spec
    impl = make_impl(definition)
    impl.__name__ = spec.name
    native = _native_launcher(definition)
    earlier = _LIVE.get(definition.op_name)
    op = PnexOp.__new__(PnexOp)
    op._pnex = definition
    op._native = native is not None
    arguments = spec.arguments
    op._nargs = len(arguments)
    op._tensor_slots = tuple(i for i, p in enumerate(arguments) if isinstance(p, TensorParam))
    op._scalar_slots = tuple(i for i, p in enumerate(arguments) if isinstance(p, ScalarParam))
    op._scalar_types = {i: p.dtype.python_type for i, p in enumerate(arguments) if isinstance(p, ScalarParam)}
    CustomOpDef.__init__(op, NAMESPACE, definition.op_name, spec.schema, impl)
    op.register_kernel(None)(impl)
    op.register_fake(make_fake(definition))
    if native is not None:
        try:
            native.register(definition)
        except Exception as exc:
            _warn_python_launcher(definition, exc)
            op._native = False
            if hasattr(CustomOpDef, "_register_autograd_dispatcher_impl"):  # torch >= 2.12 split these out
                CustomOpDef._register_autograd_dispatcher_impl(op)
                CustomOpDef._register_adinplaceorview_dispatcher_impl(op)
    _redirect_earlier(earlier, op)
    _LIVE[definition.op_name] = weakref.WeakSet([op, *(earlier or ())])
    return op


# Every op object ever made for an op name.  Re-registering a name frees the old
# registration, so an object still held from before (a model's attribute, a report,
# a compiled function) would call into freed memory; instead it is pointed at the new
# registration: an old name keeps meaning "the kernel defined under this name last".
_LIVE: dict[str, weakref.WeakSet] = {}


def _redirect_earlier(earlier: weakref.WeakSet | None, op: PnexOp) -> None:
    for old in list(earlier or ()):
        if old is op:
            continue
        old.__dict__.clear()
        old.__dict__.update(op.__dict__)


def _native_launcher(definition: KernelDefinition):
    """The C++ launcher module when CUDA calls should go through it, else ``None``."""
    from .launch import native

    native.unregister(definition)  # drop what an earlier definition of this name registered
    if not native.native_wanted() or definition.compiled_if_available() is None:
        return None
    try:
        native.load_launcher(verbose=definition.options.verbose)
    except Exception as exc:  # no compiler, no headers: the Python launcher still works
        _warn_python_launcher(definition, exc)
        return None
    return native


def _warn_python_launcher(definition: KernelDefinition, exc: BaseException) -> None:
    import logging

    text = str(exc).strip()
    logging.getLogger(__name__).warning(
        "pnex: kernel %r uses the Python GPU launcher (slower per call) because the C++ launcher "
        "is unavailable: %s",
        definition.spec.name,
        text.splitlines()[0] if text else type(exc).__name__,
    )


def _translate(exc: BaseException) -> BaseException:
    """Errors raised by the C++ launcher start with 'pnex: '; give them the package's
    exception types."""
    text = str(exc)
    if not text.startswith("pnex: "):
        return exc
    message = text[len("pnex: "):].split("\nException raised from")[0].strip()
    if isinstance(exc, TypeError):
        return ArgumentTypeError(message)
    if isinstance(exc, ValueError):
        return ArgumentShapeError(message)
    return KernelLaunchError(message)
