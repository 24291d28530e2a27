"""A kernel's checked variant: its source rewritten, rebuilt, and its sites.

:func:`checked_kernel` reads the kernel's source (:mod:`.source`), asks what it
proves (:mod:`.index_ranges`), rewrites every other access into a helper call
(:mod:`.rewrite`), and compiles the result as a new function with the same name,
parameters, globals, closure, file name and line numbers, plus one trailing
parameter, the error record (:data:`~pnex_magic.checking.record.ERR_PARAM`).  The
helpers' CUDA implementations are registered with Numba then (:mod:`.overloads`).
"""

from __future__ import annotations

import ast
import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import KernelDefinitionError
from ..tc.usage import call_primitive
from . import overloads
from .helpers import HELPERS, RESERVED
from .index_ranges import IndexRanges
from .record import ERR_PARAM, FLAG, Site, describe_violation
from .rewrite import Rewriter, array_roles
from .sizes import tensor_dims
from ..kernelsource import bound_names, kernel_source, namespace_of, plain_signature, rebuild
from .tc_helpers import TC_HELPERS

__all__ = ["CheckedKernel", "checked_kernel"]


@dataclasses.dataclass(frozen=True)
class CheckedKernel:
    """A kernel's checked variant: compile :attr:`function` in place of the kernel
    (for the GPU, and in the CUDA simulator) with one more argument, the error
    record (:func:`~pnex_magic.checking.record.error_buffer`)."""

    function: types.FunctionType
    sites: tuple[Site, ...]
    #: Accesses left unchecked because the source proves them in bounds
    #: (:mod:`pnex_magic.checking.index_ranges`): on-chip arrays indexed within their
    #: constant shape, tensors indexed under a guard on their size.
    proven: tuple[Site, ...] = ()

    def describe(self, record: Sequence[int]) -> str | None:
        """:func:`~pnex_magic.checking.record.describe_violation` for this kernel
        (``None``: no violation)."""
        if not int(record[FLAG]):
            return None
        return describe_violation(self.function.__name__, record, self.sites)


def _check_signature(fn: types.FunctionType, fdef: ast.FunctionDef) -> None:
    args = fdef.args
    if args.vararg or args.kwarg or args.kwonlyargs:
        raise KernelDefinitionError(
            f"kernel {fn.__name__!r}: a kernel takes positional parameters only (no *args, **kwargs or keyword-only)"
        )
    used = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)} | {a.arg for a in args.posonlyargs + args.args}
    reserved = sorted(n for n in used if n.startswith(RESERVED))
    if reserved:
        raise KernelDefinitionError(
            f"kernel {fn.__name__!r}: names starting with {RESERVED!r} are reserved for the checked variant: "
            f"{', '.join(reserved)}"
        )


def _primitives(fdef: ast.FunctionDef, params: set[str], namespace: dict[str, Any]) -> Callable[[ast.Call], str | None]:
    """Which ``pnex.tc`` primitive a call of the kernel names (a local or a parameter
    of the same name is not one)."""
    local = bound_names(fdef.body) | params

    def primitive_of(call: ast.Call) -> str | None:
        root = call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in local:
            return None
        return call_primitive(call.func, namespace)

    return primitive_of


def checked_kernel(fn: Callable, spec: Any = None, hidden: Sequence[str] = ()) -> CheckedKernel:
    """The checked variant of kernel ``fn`` (see :mod:`pnex_magic.checking`).

    ``spec``: the op's :class:`~pnex_magic.spec.KernelSpec`, which tells what accesses
    can be proven in bounds: its block candidates bound ``cuda.threadIdx``, its shape
    declarations say which tensor axes have the same size.  ``None``: no such
    knowledge (any block, every tensor axis its own size).  ``hidden``: names the kernel
    reads as globals that become parameters after the error record (device arrays
    passed as hidden arguments, :mod:`pnex_magic.snapshot`); their accesses are checked
    like a parameter's.

    Raises
    ------
    KernelDefinitionError
        ``fn`` has no Python source here, has ``*args``/``**kwargs``/keyword-only
        parameters, or uses a name starting with ``__pnex_`` (reserved).
    """
    fn = getattr(fn, "py_func", fn)
    if not isinstance(fn, types.FunctionType):
        raise KernelDefinitionError(f"a checked variant is built from a Python function, got {fn!r}")
    source = kernel_source(fn)
    fdef = source.fdef
    _check_signature(fn, fdef)
    params = {a.arg for a in fdef.args.posonlyargs + fdef.args.args}
    blocks = spec.block_candidates if spec is not None else None
    namespace = {k: v for k, v in namespace_of(fn).items() if k not in hidden}  # arguments now: nothing is known
    ranges = IndexRanges(fdef, namespace, blocks, tensor_dims(spec) if spec is not None else None)
    roles = {**array_roles(fdef), **{name: "global device array" for name in hidden}}
    rewriter = Rewriter(dict(source.lines), params, roles, ranges, _primitives(fdef, params, namespace))
    fdef.body = rewriter.visit_block(fdef.body)
    # Same name and parameters, no decorators, annotations or defaults (the launch
    # passes every argument), plus the error record, then the hidden arguments.
    plain_signature(fdef)
    fdef.args.args.append(ast.arg(arg=ERR_PARAM))
    fdef.args.args += [ast.arg(arg=name) for name in hidden]
    overloads.register()
    function = rebuild(fn, fdef, {**HELPERS, **TC_HELPERS})
    return CheckedKernel(function=function, sites=tuple(rewriter.sites), proven=tuple(rewriter.proven))
