"""The derived backward as a pnex op: its source, its spec, its definition, attached.

:func:`derive_backward` reads the forward kernel's source, builds its statements
(:mod:`.program`), decides how each gradient is written (:mod:`.ownership`), writes the
backward kernel's Python source (:mod:`.emit`) with its signature, and defines it
through the same core as any kernel (:func:`pnex_magic.define.definition`,
:func:`~pnex_magic.define.registered`): the compile cache keys its source, the report
and ``pnex.inspect`` show it, the launchers run it.  Its parameters follow the naming
:func:`pnex_magic.autograd.attach_backward` wires by:

* the forward's ``In`` tensors and ``Scalar`` parameters (saved by autograd), its
  ``Tune`` parameters (the same choices);
* ``grad_<out>`` (``In``) for each floating-point ``Out``: the incoming gradient;
* ``grad_<in>`` (``Out``) for each floating-point ``In``: its gradient.

``Scalar`` parameters get no gradient, nor do integer tensors; integer outputs are not
differentiable.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import linecache
import math
import types
from typing import Any

import numpy as np

from .. import annotations as annotations_module
from ..checking.index_ranges import IndexRanges
from ..checking.rewrite import proven_subscripts
from ..checking.sizes import tensor_dims
from ..kernelsource import kernel_source, namespace_of, rebuild
from ..define import definition
from ..definition import JitOptions, KernelDefinition
from ..errors import KernelDefinitionError
from ..expressions import BinOp, Expr, MinMax, Neg, Numel, Size
from ..lazycuda import cuda as lazy_cuda
from ..lazycuda import is_lazy_cuda
from ..spec import KernelSpec, ScalarParam, TensorParam, TuneParam
from ..tc.usage import primitive_sites
from .emit import write_body
from .ownership import GradPlan, plan_gradients
from .program import Names, build_program
from .values import Refusal, Scope, grad_name

__all__ = ["DerivedKernel", "derive_kernel", "SUFFIX"]

#: The derived backward's name: the forward's plus this.
SUFFIX = "_adjoint"
_ASKED_BY = 'backward="auto", %%pnex --backward auto, pnex.derive_backward'


@dataclasses.dataclass(frozen=True)
class DerivedKernel:
    """A forward kernel's derived backward, before it is an op."""

    function: types.FunctionType  #: the backward kernel (its source is in linecache)
    source: str  #: its Python source
    spec: KernelSpec  #: the forward's spec
    plans: tuple[GradPlan, ...]  #: how each floating-point In tensor's gradient is written
    n_threads: tuple[str, ...]
    threads_per_block: Any
    autotune_key: tuple[str, ...] | None

    def definition(self, options: JitOptions) -> KernelDefinition:
        return definition(self.function, n_threads=self.n_threads, threads_per_block=self.threads_per_block,
                          autotune_key=self.autotune_key, options=options,
                          tune_requires={r.text: r.why for r in self.spec.tune_rules} or None)  # the same variants


def _substitute(expr: Expr, outputs: dict[str, TensorParam]) -> Expr:
    """``expr`` with every size of an output replaced by the output's shape expression
    (a backward has no outputs of the forward's: only their gradients)."""
    if isinstance(expr, Size) and expr.param in outputs:
        return _substitute(outputs[expr.param].shape[expr.axis], outputs)
    if isinstance(expr, Numel) and expr.param in outputs:
        shape = [_substitute(e, outputs) for e in outputs[expr.param].shape]
        total = shape[0]
        for e in shape[1:]:
            total = BinOp("*", total, e)
        return total
    if isinstance(expr, BinOp):
        return BinOp(expr.op, _substitute(expr.left, outputs), _substitute(expr.right, outputs))
    if isinstance(expr, Neg):
        return Neg(_substitute(expr.operand, outputs))
    if isinstance(expr, MinMax):
        return MinMax(expr.fn, tuple(_substitute(a, outputs) for a in expr.args))
    return expr


def _shape_text(shape, outputs) -> str:
    items = ["None" if e is None else repr(str(_substitute(e, outputs))) for e in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _signature(spec: KernelSpec, plans: list[GradPlan], pnex: str) -> list[str]:
    outputs = {p.name: p for p in spec.outputs}
    lines = []
    for p in spec.params:
        if isinstance(p, TensorParam) and p.role == "in":
            lines.append(f"{p.name}: {pnex}.In({p.dtype.name!r}, {_shape_text(p.shape, outputs)})")
        elif isinstance(p, ScalarParam):
            lines.append(f"{p.name}: {pnex}.Scalar({p.dtype.name!r})")
        elif isinstance(p, TuneParam):
            lines.append(f"{p.name}: {pnex}.Tune({', '.join(map(repr, p.choices))})")
        elif isinstance(p, TensorParam) and p.role == "out" and p.dtype.is_floating_point:
            lines.append(f"{grad_name(p.name)}: {pnex}.In({p.dtype.name!r}, {_shape_text(p.shape, outputs)})")
    for plan in plans:
        init = "" if plan.init is None else f", init={plan.init}"
        lines.append(f"{grad_name(plan.tensor)}: {pnex}.Out({plan.dtype!r}, {plan.tensor!r}{init})")
    return lines


def _helpers(fn: types.FunctionType, fdef: ast.FunctionDef, namespace: dict) -> tuple[dict[str, str], dict, set]:
    """The names the backward's code uses for ``math``, ``numba.cuda``, a float32
    constructor and pnex's annotations: the forward's own where it has them, else new
    ones that no name of the forward's shadows.  Returns (role -> name, what to inject,
    every name the forward uses)."""
    used = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)} | {a.arg for a in fdef.args.args}
    used |= set(fn.__code__.co_names) | set(fn.__code__.co_varnames) | set(fn.__code__.co_freevars)
    wanted = {"math": ("math", math), "cuda": ("cuda", lazy_cuda), "f32": ("float32", np.float32),
              "u64": ("uint64", np.uint64), "pnex": ("pnex", annotations_module)}
    roles, inject = {}, {}
    for role, (name, value) in wanted.items():
        have = namespace.get(name)
        same = have is value or (role == "cuda" and (is_lazy_cuda(have) or getattr(have, "__name__", "") == "numba.cuda"))
        if role == "pnex" and have is not None and all(hasattr(have, a) for a in ("In", "Out", "Scalar", "Tune")):
            same = True
        if not same and name in used:
            name = f"pnex_{name}"
        roles[role] = name
        if not same:
            inject[name] = value
    return roles, inject, used | set(inject)


def _refuse_tensor_cores(fn: types.FunctionType, refuse: Refusal) -> None:
    """Tensor-core primitives (:mod:`pnex_magic.tc`) have no derivative rule: the first
    call, in the kernel or in a device function it calls, is refused by its line."""
    for primitive, where, line in primitive_sites(fn):
        what = f"pnex.tc.{primitive} (tensor cores) has no derivative rule: derive_backward cannot differentiate it"
        if where.__code__ is fn.__code__:
            raise refuse(line, what)
        raise refuse(None, f"{what} (the device function {where.__name__} calls it at "
                           f"{where.__code__.co_filename}:{line})")


def derive_kernel(fn: types.FunctionType, spec: KernelSpec, *, atomic_only: bool = False) -> DerivedKernel:
    """The backward of kernel ``fn`` (its spec ``spec``), derived from its source.

    Raises
    ------
    KernelDefinitionError
        The forward cannot be differentiated exactly: it has ``InMut`` parameters, no
        floating-point ``Out`` or ``In`` tensor, no Python source here, or a construct
        the transform does not handle (the message names the line).
    """
    name = spec.name
    if spec.mutated:
        raise KernelDefinitionError(
            f"derive_backward({name}): the kernel writes {', '.join(map(repr, spec.mutated))} in place (InMut); "
            f"autograd differentiates functional ops only. Declare the results as Out(...)")
    if not any(p.dtype.is_floating_point for p in spec.outputs):
        raise KernelDefinitionError(f"derive_backward({name}): the kernel has no floating-point Out tensor; integer "
                                    f"outputs are not differentiable")
    if not any(isinstance(p, TensorParam) and p.role == "in" and p.dtype.is_floating_point for p in spec.params):
        raise KernelDefinitionError(f"derive_backward({name}): the kernel has no floating-point In tensor to "
                                    f"differentiate with respect to (Scalar parameters get no gradient)")
    source = kernel_source(fn, "a derived backward", _ASKED_BY)
    fdef = source.fdef
    namespace = namespace_of(fn)
    helpers, inject, used = _helpers(fn, fdef, namespace)
    refuse = Refusal(name, source.lines)
    _refuse_tensor_cores(fn, refuse)
    ranges = IndexRanges(fdef, namespace, spec.block_candidates, tensor_dims(spec))
    scope = Scope(fdef, spec, namespace, refuse, helpers, ranges.bindings)
    names = Names(used | {grad_name(p.name) for p in spec.params} | set(dir(builtins)))
    program = build_program(fdef, scope, names, helpers)

    def render(node: ast.expr) -> tuple[str, frozenset[str]] | None:
        # a size the ownership proof compares with: its code, if no local in it is bound twice
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and len(ranges.bindings.of.get(n.id, [])) > 1:
                return None
        try:
            op = scope.verbatim(node)
        except KernelDefinitionError:
            return None
        return op.text, op.reads

    proven = proven_subscripts(fdef, ranges)
    accumulators, plans = plan_gradients(spec, program.root, program.loads, ranges, names, render, atomic_only,
                                         proven)
    body = write_body(program, accumulators, names, helpers, refuse, names.origin)
    backward = f"{name}{SUFFIX}"
    where = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}"
    params = _signature(spec, plans, helpers["pnex"])
    text = "\n".join([
        f"def {backward}(",
        *(f"    {p}," for p in params),
        "):",
        f'    """The backward of {name}, derived by pnex from its source ({where}):',
        "    the forward's values are recomputed, then their adjoints accumulated, last statement first.",
        '    """',
        *body,
    ]) + "\n"
    filename = f"<pnex derived backward of {spec.module}.{spec.qualname}>"
    lines = text.splitlines(keepends=True)
    linecache.cache[filename] = (len(text), None, lines, filename)
    tree = ast.parse(text, filename)
    function = rebuild(fn, tree.body[0], inject, "a derived backward", filename)
    function.__qualname__ = fn.__qualname__ + SUFFIX
    function.__doc__ = ast.get_docstring(tree.body[0])
    function.pnex_derived_from = name  # what the report says of it
    outputs = {p.name: p for p in spec.outputs}
    n_threads = tuple(str(_substitute(e, outputs)) for e in spec.n_threads)
    key = None if spec.autotune_key is None else tuple(str(_substitute(e, outputs)) for e in spec.autotune_key)
    blocks = [tuple(c) for c in spec.candidates] if spec.candidates else tuple(spec.threads_per_block)
    return DerivedKernel(function, text, spec, tuple(plans), n_threads, blocks, key)
