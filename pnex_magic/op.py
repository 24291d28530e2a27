"""Torch-op stage: a kernel (defined here, or loaded from a saved artifact) becomes a
``torch.library`` custom operator.

The operator's schema comes from the spec (``In``/``InMut``/``Scalar`` are
arguments, ``InMut`` marked as mutated, ``Out`` tensors returned).  One Python
implementation serves every device that no launcher serves from C++: it checks
the arguments, allocates the outputs on the inputs' device, evaluates the launch
grid and hands over to the launcher for that device.  The fake implementation
runs the same checks and shape expressions on fake tensors, so
``torch.compile(fullgraph=True)`` traces through calls with symbolic sizes.

While the op is being defined, every launcher is offered the definition
(:func:`pnex_magic.launch.register`); the C++ launcher registers its own CUDA
kernel then, and the op leaves that device to it.  Where the C++ launcher is
still being built, the op starts with its Python kernels and the launcher moves
it onto its own later (:mod:`pnex_magic.launch.switch`, the first run in an
environment): its calls go through :func:`pnex_magic.launch.call` until then.
This module makes one op; :mod:`pnex_magic.define` decides what happens to
earlier ops of the same name.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
from typing import Any

import torch
from torch._library import autograd as _autograd
from torch._library.custom_ops import CustomOpDef

from . import launch
from .calls import bind_arguments, check_arguments, inmut_grad_error, launch_grid, output_shapes
from .conditions import BROKEN, reworded
from .errors import (
    ArgumentShapeError,
    ArgumentTypeError,
    ArgumentValueError,
    KernelDefinitionError,
    KernelIndexError,
    KernelLaunchError,
)
from .launch.kernel import Kernel
from .random import draw_seed
from .spec import KernelSpec, ScalarParam, TensorParam

__all__ = ["PnexOp", "make_op", "NAMESPACE", "Superseded", "ATTACHED", "attached_backward"]

NAMESPACE = "pnex"
#: Where :func:`pnex_magic.autograd.attach_backward` records the attached backward op: an
#: attribute of the backward function torch keeps (``op._backward_fn``).
ATTACHED = "pnex_attached"


def attached_backward(op: Any) -> Any:
    """The :class:`~pnex_magic.autograd.Attached` record of the backward op attached to
    ``op`` with ``attach_backward`` (``None`` if there is none, or if the op's autograd
    formula was registered some other way)."""
    return getattr(getattr(op, "_backward_fn", None), ATTACHED, None)


@dataclasses.dataclass(frozen=True)
class Superseded:
    """Why an op object may no longer be called: its name was redefined with another
    signature (see :mod:`pnex_magic.define`)."""

    old_signature: str
    new_signature: str
    where: str  # file:line of the new definition

    def error(self, name: str) -> KernelDefinitionError:
        return KernelDefinitionError(
            f"{name}(): this op object is from an earlier definition, {self.old_signature}; the op was "
            f"redefined at {self.where} as {self.new_signature}. Use the object the new definition returned "
            f"(re-run the code that holds this one, e.g. rebuild the model)"
        )


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


#: torch's default device where an op whose arguments are all scalars was called (set by
#: PnexOp.__call__): inside the op torch has set a ``with torch.device(...)`` block aside.
_call_site_device: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("pnex_call_site_device", default=None)


def _default_device() -> torch.device:
    """Where an op whose arguments are all scalars makes its outputs: torch's default
    device (``torch.set_default_device``, ``with torch.device(...)``), with the current
    CUDA device's index where it names none."""
    device = _call_site_device.get()
    if device is None:
        # torch.get_default_device() cannot serve here: it fills a missing index from a
        # tensor it makes, and inside an op that tensor is made on the CPU.
        context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
        device = context.device if context is not None else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def make_impl(definition: Kernel):
    spec = definition.spec

    def impl(*args):
        env = bind_arguments(spec, args)
        device = check_arguments(spec, env) or _default_device()
        outs = _allocate(spec, env, device, fake=False)
        if spec.seeds and all(int(e.evaluate(env)) for e in spec.n_threads):
            for p in spec.seeds:  # a draw per call that launches (as the C++ launcher); tuning reuses it
                env[p.name] = draw_seed(device)
        values = [env.get(p.name) for p in spec.params]
        launcher = launch.launcher_for(device)
        shape, variant = None, 0
        if spec.autotuned:
            shape, variant = spec.launch_candidates[launcher.candidate(definition, values, device)]
            if variant:
                env.update(spec.tune_values(variant))
                values = [env.get(p.name) for p in spec.params]
        grid, block = launch_grid(spec, env, shape)
        if grid[0] and grid[1] and grid[2]:
            launcher.launch(definition, values, grid, block, device, variant)
        return _result(outs)

    return impl


def make_fake(definition: Kernel):
    spec = definition.spec

    def fake(*args):
        env = bind_arguments(spec, args)
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

    _pnex: Kernel
    _superseded: Superseded | None = None  # set with _fast = None (see pnex_magic.define)
    # What the C call slot (pnex_magic.launch.install_fast_call) calls and checks: (the
    # OpOverload's C++ entry, the number of arguments, the scalars' exact types); None: use
    # __call__.
    _fast: tuple | None = None
    _scalars_only = False  # no tensor argument: outputs on torch's default device (_default_device)

    def __call__(self, *args, **kwargs):
        if self._superseded is not None:
            raise self._superseded.error(self._pnex.spec.name)
        if kwargs or len(args) != self._nargs:
            args = self._bind_call(args, kwargs)
        # Scalars' kinds are checked here (the dispatcher would take a bool for an int);
        # tensors' by the dispatcher and the launcher, whose refusal brings the Python
        # checks' clear message below.  Precomputed per op (make_op): a call costs one
        # type() per scalar.
        for i, kinds in self._scalar_kinds:
            if type(args[i]) not in kinds:
                self._check_types(args)
        token = None
        if self._scalars_only and not _is_compiling():  # its outputs go to torch's default device
            token = _call_site_device.set(torch.get_default_device())
        try:
            if _is_compiling():  # Dynamo traces the OpOverload, not its C++ callable
                return self._opoverload(*args)
            # The OpOverload's C++ callable, without its Python frame (counted while ops
            # wait for the C++ launcher: see pnex_magic.launch.switch).
            return launch.call(self._call, args)
        except Exception as exc:  # noqa: BLE001 (what is not translated is raised as it is)
            return self._call_failed(exc, args)
        finally:
            if token is not None:
                _call_site_device.reset(token)

    def _call_failed(self, exc: BaseException, args: tuple) -> Any:
        """Raise the error a failed call gives (the C call slot's and ``__call__``'s path):
        the C++ launcher's and the dispatcher's errors become pnex's exception types."""
        if not isinstance(exc, (TypeError, ValueError, RuntimeError, IndexError, AttributeError)):
            raise exc
        # (the dispatcher passes None for a Tensor on as an undefined tensor: AttributeError)
        if not str(exc).startswith("pnex: "):
            self._check_types(args)  # a non-tensor where a tensor goes: name the argument
        translated = _translate(exc, self._pnex.spec.name)
        if translated is exc:
            raise exc
        raise translated from None

    def _check_types(self, args: tuple) -> None:
        """Python-side checks of the arguments' kinds (a tensor where a tensor goes, an
        int where an int goes), so mistakes get a clear message instead of the
        dispatcher's or a failure deep in the implementation."""
        spec = self._pnex.spec
        for p, value in zip(spec.arguments, args):
            if isinstance(p, TensorParam):
                if not isinstance(value, torch.Tensor):
                    states = (
                        f"; make the states with pnex.xoroshiro128p_states(n, seed, device), a (n, 2) uint64 tensor "
                        f"(the streams numba.cuda.random.create_xoroshiro128p_states makes)" if p.dtype.is_record else ""
                    )
                    raise ArgumentTypeError(
                        f"{spec.name}(): argument {p.name!r} must be a torch.Tensor ({p.describe()}), "
                        f"got {type(value).__name__}{states}"
                    ) from None
            elif isinstance(p, ScalarParam) and not _scalar_ok(p, value):
                raise ArgumentTypeError(
                    f"{spec.name}(): argument {p.name!r} must be a Python {p.dtype.python_type.__name__} "
                    f"({p.describe()}), got {type(value).__name__} {value!r}"
                ) from None

    @property
    def _native(self) -> bool:
        """Whether the C++ launcher's own dispatcher kernels serve the op's CUDA calls
        (from its definition, or since it switched to them)."""
        return launch.native_registered(self._pnex.op_name)

    def register_autograd(self, backward, /, *, setup_context=None) -> None:
        super().register_autograd(backward, setup_context=setup_context)
        # The C++ launcher's "not implemented" autograd kernels step aside (an op that
        # switches to it later keeps CustomOpDef's autograd kernel).
        launch.autograd_registered(self._pnex)
        if self._native and not torch._C._dispatch_has_kernel_for_dispatch_key(self._qualname, "Autograd"):
            # Registered on the C++ launcher from the start: CustomOpDef's autograd kernel was never registered.
            self._lib.impl(self._name, _autograd.make_autograd_impl(self._opoverload, self), "Autograd", with_keyset=True)

    def _register_autograd_dispatcher_impl(self) -> None:
        # Called by CustomOpDef.__init__ (torch >= 2.12) right after the schema is
        # defined: the moment to let the launchers register their own kernels.  With the
        # C++ launcher, autograd and ADInplaceOrView kernels are C++ (registered by the
        # launcher); CustomOpDef's Python ones would run on every call.
        self._register_launchers()
        if not self._native:
            super()._register_autograd_dispatcher_impl()

    def _register_launchers(self) -> None:
        if not self._launchers_registered:
            self._launchers_registered = True
            launch.register(self._pnex)

    def _register_adinplaceorview_dispatcher_impl(self) -> None:
        if not self._native:
            super()._register_adinplaceorview_dispatcher_impl()

    def _bind_call(self, args: tuple, kwargs: dict) -> tuple:
        spec = self._pnex.spec
        arguments = spec.arguments
        names = [p.name for p in arguments]
        outputs = {p.name for p in spec.outputs}
        tuned = [p.name for p in spec.tune_params]
        for key in kwargs:
            if key in tuned:
                raise ArgumentTypeError(_tune_passed(spec.name, key))
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
            if tuned and len(args) <= len(arguments) + len(tuned):
                raise ArgumentTypeError(_tune_passed(spec.name, tuned[len(args) - len(arguments) - 1]))
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
            if p.name in kwargs:
                bound.append(kwargs[p.name])
            elif isinstance(p, ScalarParam) and p.has_default:
                bound.append(p.default)  # what the schema's default would give
            else:
                missing = [
                    q.name for q in arguments[len(bound):]
                    if q.name not in kwargs and not (isinstance(q, ScalarParam) and q.has_default)
                ]
                raise ArgumentTypeError(
                    f"{spec.name}() is missing argument(s) {', '.join(map(repr, missing))}; "
                    f"it takes ({', '.join(names)})"
                )
        return tuple(bound)

    @property
    def definition(self) -> Kernel:
        return self._pnex

    @property
    def backward_source(self) -> str | None:
        """The Python source of the backward kernel attached to this op: the generated
        source of a derived backward (``jit(backward="auto")``, ``%%pnex --backward auto``),
        or a hand-written backward's own; ``None`` without one, or for a backward that has
        no source here (loaded from an artifact)."""
        import inspect
        import textwrap

        attached = attached_backward(self)
        fn = getattr(getattr(getattr(attached, "backward", None), "_pnex", None), "fn", None)
        if fn is None:
            return None
        try:
            return textwrap.dedent(inspect.getsource(fn))
        except (OSError, TypeError):
            return None

    @property
    def spec(self) -> KernelSpec:
        return self._pnex.spec

    def __repr__(self) -> str:
        return f"<pnex op {NAMESPACE}::{self._pnex.op_name}: {self._pnex.spec.python_signature()}>"


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _tune_passed(name: str, param: str) -> str:
    return (
        f"{name}(): {param!r} is a Tune parameter: the autotuner chooses it among its choices (the simulator and "
        f"calls that do not tune take the first), so callers do not pass it. To fix it, give it one choice "
        f"(Tune(4)), or in a notebook override the choices with %%pnex --tune {param}=..."
    )


def _scalar_ok(p: ScalarParam, value: Any) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if p.dtype.schema_scalar == "bool":
        return isinstance(value, bool)
    if p.dtype.schema_scalar == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def make_op(definition: Kernel) -> PnexOp:
    """Register ``definition`` as ``torch.ops.pnex.<op_name>`` (replacing any op of
    that name in the dispatcher) and return the op object."""
    spec = definition.spec
    impl = make_impl(definition)
    impl.__name__ = spec.name
    launch.unregister(definition.op_name)  # what an earlier definition of this name left
    op = PnexOp.__new__(PnexOp)
    op._pnex = definition
    op._launchers_registered = False
    arguments = spec.arguments
    op._nargs = len(arguments)
    # The exact Python types a scalar argument takes without the slow check (an int is a
    # fine float); anything else goes through _check_types.
    op._scalar_kinds = tuple(
        (i, (float, int) if p.dtype.python_type is float else (p.dtype.python_type,))
        for i, p in enumerate(arguments) if isinstance(p, ScalarParam)
    )
    _name_pnex_files_for_inspect()
    CustomOpDef.__init__(op, NAMESPACE, definition.op_name, spec.schema, impl)
    op._register_launchers()  # torch < 2.12 has no hook in __init__: register after it
    if spec.mutated and not op._native:  # the C++ launcher checks in its own autograd kernel
        _register_inmut_grad_check(op)
    op.register_kernel(None)(impl)
    _skip_dynamo_until_imported(op)
    op.register_fake(make_fake(definition))
    op._call = getattr(op._opoverload, "_op", op._opoverload)
    op._scalars_only = not any(isinstance(p, TensorParam) for p in arguments)
    # An op of scalars only reads the default device in __call__, which the C call slot skips.
    op._fast = None if op._scalars_only else (op._call, op._nargs, op._scalar_kinds)
    launch.install_fast_call(PnexOp)  # once the C++ launcher serves: calls skip __call__'s frame (checks stay)
    return op


def _name_pnex_files_for_inspect() -> None:
    """torch's fake-kernel registration names the line that registers it (a line of
    pnex's) with ``inspect.getframeinfo``, whose ``inspect.getmodule`` scans every loaded
    module's file for the one holding it, unless that file was seen before: 0.1-0.5 s
    the first time in a process with Numba loaded, most of a cache hit's time.  Tell
    ``inspect`` where pnex's own modules live (what its scan would find) so it never
    needs to scan for them."""
    import inspect
    import os

    known = getattr(inspect, "modulesbyfile", None)
    if not isinstance(known, dict):
        return
    for name, module in sys.modules.copy().items():  # a snapshot: the warm-up thread may import meanwhile
        if name.startswith("pnex_magic") and name not in _NAMED:
            file = getattr(module, "__file__", None)
            if not file:  # a namespace package: no file
                continue
            # what inspect.getabsfile gives for a module loaded from source, without its lookups
            file = os.path.normcase(os.path.abspath(file))
            known.setdefault(file, name)
            known.setdefault(os.path.realpath(file), name)
            _NAMED.add(name)


_NAMED: set[str] = set()


def _skip_dynamo_until_imported(op: PnexOp) -> None:
    """``register_kernel`` wraps the implementation in ``torch._disable_dynamo``, which
    imports ``torch._dynamo`` at the first call (1.5 s and more on a CPU) so as to keep
    Dynamo from tracing into it.  Until something else imports Dynamo nothing can be
    tracing, so calls go straight to the implementation; after that, through torch's
    wrapper as before.  (GPU calls of a C++-launched op never reach this.)"""
    inner = op._backend_fns.get(None)
    plain = getattr(inner, "__wrapped__", None)
    if inner is None or plain is None:  # another torch: leave its wrapper alone
        return
    modules = sys.modules

    def backend(*args, **kwargs):
        if "torch._dynamo" in modules:
            return inner(*args, **kwargs)
        return plain(*args, **kwargs)

    op._backend_fns[None] = backend


def _register_inmut_grad_check(op: PnexOp) -> None:
    """Refuse, with grad mode on, a call whose ``InMut`` argument requires grad
    (:func:`pnex_magic.calls.inmut_grad_error`): autograd cannot see the kernel's writes.

    The check runs at the autograd dispatch keys of CPU and CUDA tensors, so every call
    crosses it (the op object, ``torch.ops.pnex``, ``torch.compile``'s tracing on fake
    tensors); below them grad mode is off.  It then runs ``CustomOpDef``'s own autograd
    kernel, which it takes precedence over (registered for the ``Autograd`` alias key)."""
    spec = op._pnex.spec
    inmut = tuple((i, p.name) for i, p in enumerate(spec.arguments) if p.role == "inmut")
    autograd_kernel = _autograd.make_autograd_impl(op._opoverload, op)

    def checked_autograd_kernel(keyset, *args, **kwargs):
        if torch.is_grad_enabled():
            for i, name in inmut:
                t = args[i]
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    raise inmut_grad_error(spec.name, name, t.is_leaf)
        return autograd_kernel(keyset, *args, **kwargs)

    for key in ("AutogradCPU", "AutogradCUDA"):
        op._lib.impl(op._name, checked_autograd_kernel, key, with_keyset=True)


def _translate(exc: BaseException, name: str) -> BaseException:
    """Errors raised by the C++ launcher start with 'pnex: '; give them the package's
    exception types.  CUDA's report of an earlier kernel's fault, raised at this call by
    PyTorch, becomes a KernelLaunchError naming the pnex kernels that ran last."""
    text = str(exc)
    if not text.startswith("pnex: "):
        if isinstance(exc, RuntimeError) and launch.is_fault(exc):
            first = text.strip().splitlines()[0]
            return KernelLaunchError(f"{name}(): CUDA reported at this call: {first}. {launch.fault_hint()}".strip())
        return exc
    message = text[len("pnex: "):].split("\nException raised from")[0].strip()
    if isinstance(exc, KernelIndexError):
        return exc
    if isinstance(exc, IndexError):  # a checked launch's record (the C++ launcher formats it)
        return launch.native.taken_violation(message) or KernelIndexError(message)
    if isinstance(exc, TypeError):
        return ArgumentTypeError(message)
    if isinstance(exc, ValueError):
        if BROKEN in message:  # jit(requires=...) or tune_requires per call, csrc/launcher_call.cpp
            return ArgumentValueError(reworded(message))
        return ArgumentShapeError(message)
    return KernelLaunchError(message)
