"""What every name of a kernel is bound to: the table the index proofs read.

:class:`Bindings` walks a kernel's ``def`` once and records, for each local name, every
binding the function makes of it (flow-insensitive: all of them, wherever they are):

* an expression (``i = cuda.threadIdx.x + 1``, ``i += 1`` as ``i + 1``);
* :class:`RangeBinding`, a ``for`` target over ``range(...)``;
* :class:`Element`, entry ``k`` of a tuple that is not written out (``rows, cols = x.shape``);
* :data:`PARAM`, a positional parameter of the kernel;
* :data:`UNKNOWN`, any other form (tuple unpacking from a starred target, ``with ... as``,
  ``global``, a walrus, ``del``, a nested function's parameter, ...).

A name not bound in the function is a global or closure value: :meth:`Bindings.value_of`
reads it from the kernel's namespace (then the builtins), and :meth:`Bindings.cuda_path`
recognises ``numba.cuda``'s special objects however they were imported.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

from ..lazycuda import is_lazy_cuda
from ..kernelsource import range_call

__all__ = ["Bindings", "RangeBinding", "Element", "UNKNOWN", "PARAM"]


class _Unknown:
    """A binding the analysis does not understand: the name it binds is unknown."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class _Param:
    """The binding of a kernel parameter."""

    def __repr__(self) -> str:
        return "PARAM"


PARAM = _Param()


@dataclasses.dataclass(frozen=True)
class RangeBinding:
    """The binding of a ``for`` target over ``range(*args)``."""

    args: tuple[ast.expr, ...]


@dataclasses.dataclass(frozen=True)
class Element:
    """Entry ``k`` of a tuple that is not written out: ``rows, cols = u.shape``,
    ``i, j = cuda.grid(2)``."""

    source: ast.expr
    k: int


class Bindings:
    """The bindings of kernel ``fdef``'s names; ``namespace`` holds its globals and
    closure values (:func:`pnex_magic.kernelsource.namespace_of`)."""

    def __init__(self, fdef: ast.FunctionDef, namespace: Mapping[str, Any]):
        self.namespace = namespace
        self.of: dict[str, list[Any]] = {}  #: name -> its bindings, in the order met
        #: Names whose analysis is under way: met again, a name depends on itself.
        self.active: set[str] = set()
        self._collect(fdef)
        # Names assigned by a plain statement of the function's own body (not inside a loop
        # or a branch: run once, in order), and that statement's position.
        self._top: dict[str, int] = {}
        for k, stmt in enumerate(fdef.body):
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                        if isinstance(t, ast.Name):
                            self._top.setdefault(t.id, k)

    def __contains__(self, name: str) -> bool:
        """Whether the function binds ``name`` (else it is a global or closure value)."""
        return name in self.of

    def is_param(self, name: str) -> bool:
        """A parameter of the kernel that the body never rebinds."""
        return self.of.get(name) == [PARAM]

    def once(self, name: str) -> int | None:
        """The position in the function's body of the one binding of ``name`` when it is
        a plain statement there (run exactly once, in order), else ``None``."""
        bindings = self.of.get(name, [])
        return self._top.get(name) if len(bindings) == 1 and isinstance(bindings[0], ast.expr) else None

    def fold(self, name: str, cache: dict[str, Any], of_binding: Callable[[Any], Any],
             join: Callable[[Any, Any], Any]) -> Any:
        """``of_binding`` of every binding of local ``name``, joined, memoised in ``cache``;
        ``None`` when one of them is, or when the name depends on itself."""
        if name in cache:
            return cache[name]
        if name in self.active:  # depends on itself
            return None
        self.active.add(name)
        result = None
        try:
            for k, binding in enumerate(self.of[name]):
                value = of_binding(binding)
                if value is None:
                    result = None
                    break
                result = value if k == 0 else join(result, value)
        finally:
            self.active.discard(name)
        cache[name] = result
        return result

    # ------------------------------------------------------------------ outside the function
    def value_of(self, name: str) -> Any:
        """A name's value outside the function: its globals and closure, then builtins
        (:data:`UNKNOWN` for neither)."""
        if name in self.namespace:
            return self.namespace[name]
        return getattr(builtins, name, UNKNOWN)

    def builtin(self, name: str) -> Any:
        """What ``name`` is where the function does not bind it (:data:`UNKNOWN` where it
        does): ``builtin("range") is range`` unless something shadows it."""
        return UNKNOWN if name in self.of else self.value_of(name)

    def cuda_path(self, node: ast.expr) -> tuple[str, ...] | None:
        """``("threadIdx", "x")`` for ``cuda.threadIdx.x`` (or ``threadIdx.x`` imported from
        numba.cuda, or ``numba.cuda.threadIdx.x``, or the ``%%pnex`` cell's lazy ``cuda``),
        ``None`` for anything not of numba.cuda."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self.of:
            return None
        root = self.value_of(node.id)
        if is_lazy_cuda(root):
            return tuple(attrs)
        name = getattr(root, "__name__", None)
        if isinstance(root, types.ModuleType) and name == "numba.cuda":  # the module
            return tuple(attrs)
        if isinstance(root, types.ModuleType) and name == "numba" and attrs[:1] == ["cuda"]:
            return tuple(attrs[1:])
        if isinstance(root, type) and root.__module__ == "numba.cuda.stubs":  # from numba.cuda import threadIdx
            return (root.__name__, *attrs)
        return None

    # ------------------------------------------------------------------ collecting
    def _bind(self, name: str, value: Any) -> None:
        self.of.setdefault(name, []).append(value)

    def _bind_target(self, target: ast.expr, value: ast.expr | None, understood: set[int]) -> None:
        """Register ``target = value`` (``value`` ``None``: not understood)."""
        if isinstance(target, ast.Name):
            self._bind(target.id, value if value is not None else UNKNOWN)
            understood.add(id(target))
        elif isinstance(target, (ast.Tuple, ast.List)):
            starred = any(isinstance(t, ast.Starred) for t in target.elts)
            literal = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for k, t in enumerate(target.elts):
                if starred or value is None:
                    item = None
                elif literal:
                    item = value.elts[k]
                else:
                    item = Element(value, k)
                if isinstance(item, Element) and isinstance(t, ast.Name):
                    self._bind(t.id, item)
                    understood.add(id(t))
                else:
                    self._bind_target(t, item, understood)
        # a subscript or attribute target binds no name

    def _collect(self, fdef: ast.FunctionDef) -> None:
        understood: set[int] = set()
        args = fdef.args
        positional = args.posonlyargs + args.args
        own = [a for a in positional + args.kwonlyargs + [args.vararg, args.kwarg] if a is not None]
        for a in own:
            self._bind(a.arg, PARAM if a in positional else UNKNOWN)
        own_ids = {id(a) for a in own}
        for node in ast.walk(fdef):
            if node is not fdef:
                self._collect_node(node, own_ids, understood)
        # Every other name stored or deleted (a walrus, a comprehension's target, with-as, del):
        for node in ast.walk(fdef):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) and id(node) not in understood:
                self._bind(node.id, UNKNOWN)

    def _collect_node(self, node: ast.AST, own_ids: set[int], understood: set[int]) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, node.value, understood)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            self._bind_target(node.target, node.value, understood)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            load = ast.Name(id=node.target.id, ctx=ast.Load())
            self._bind(node.target.id, ast.BinOp(left=load, op=node.op, right=node.value))
            understood.add(id(node.target))
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            range_args = range_call(node.iter)
            self._bind(node.target.id, RangeBinding(range_args) if range_args is not None else UNKNOWN)
            understood.add(id(node.target))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                self._bind(name, UNKNOWN)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._bind(node.name, UNKNOWN)
        elif isinstance(node, ast.alias):
            self._bind((node.asname or node.name).split(".")[0], UNKNOWN)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(node.name, UNKNOWN)
        elif isinstance(node, ast.arg) and id(node) not in own_ids:  # a nested function's or lambda's parameter
            self._bind(node.arg, UNKNOWN)
        elif type(node).__name__ in ("MatchAs", "MatchStar", "MatchMapping"):
            name = getattr(node, "name", None) or getattr(node, "rest", None)
            if name:
                self._bind(name, UNKNOWN)
