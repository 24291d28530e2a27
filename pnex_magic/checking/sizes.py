"""Which expressions of a kernel are a tensor parameter's size, and which sizes are equal.

A tensor's sizes are known only at run time, but the op's shape declarations say
which axes have the same size in every launch (``Out("f32", "a")``,
``In("f32", ("a.size(0)",))``: the op checks inputs and makes outputs so).
:func:`tensor_dims` gives each axis a key (:data:`DimKey`), equal for axes of equal
size; :class:`TensorSizes` reads the kernel's source for expressions of those sizes
(``x.shape[k]``, ``len(x)``, a name bound only to one, a scalar parameter that sizes
an axis).  The guards (:mod:`.guards`) compare indices with them.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from ..expressions import Const, ScalarRef, Size
from .bindings import PARAM, Bindings, Element

__all__ = ["DimKey", "tensor_dims", "TensorSizes"]

#: A tensor axis's size, canonical: ``("free", param, axis)`` for an axis declared
#: ``None``, ``("const", n)``, ``("scalar", name)`` for a scalar parameter, or
#: ``("expr", text)`` for any other shape expression.  Two axes with the same key
#: have the same size in every launch: the op checks (inputs) or makes (outputs) it.
DimKey = tuple


def tensor_dims(spec: Any) -> dict[str, tuple[DimKey, ...]]:
    """Each tensor parameter of ``spec`` (a :class:`~pnex_magic.spec.KernelSpec`) and
    the keys (:data:`DimKey`) of its axes' sizes."""
    tensors = {p.name: p for p in spec.params if hasattr(p, "shape") and hasattr(p, "dtype")}
    keys: dict[tuple[str, int], DimKey] = {}

    def key(name: str, axis: int, seen: frozenset = frozenset()) -> DimKey:
        param = tensors[name]
        axis %= max(param.ndim, 1)
        if (name, axis) in keys:
            return keys[(name, axis)]
        expr = param.shape[axis]
        if expr is None or (name, axis) in seen:
            found: DimKey = ("free", name, axis)
        elif isinstance(expr, Const):
            found = ("const", expr.value)
        elif isinstance(expr, Size) and expr.param in tensors:
            found = key(expr.param, expr.axis, seen | {(name, axis)})
        elif isinstance(expr, ScalarRef):
            found = ("scalar", expr.param)
        else:
            found = ("expr", str(expr))
        keys[(name, axis)] = found
        return found

    return {name: tuple(key(name, k) for k in range(p.ndim)) for name, p in tensors.items()}


class TensorSizes:
    """The tensor parameters of a kernel (``dims``: :func:`tensor_dims`; those the body
    rebinds are left out) and the expressions of their sizes in its source."""

    def __init__(self, bindings: Bindings, dims: Mapping[str, tuple[DimKey, ...]] | None):
        self.bindings = bindings
        self.dims = {n: d for n, d in (dims or {}).items() if bindings.is_param(n)}

    def shape_of(self, node: ast.expr) -> str | None:
        """``x`` for ``x.shape`` of a tensor parameter ``x``."""
        if (isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name)
                and node.value.id in self.dims):
            return node.value.id
        return None

    def dim_of(self, node: ast.expr) -> DimKey | None:
        """The size key of ``node`` when it is a tensor parameter's size: ``x.shape[k]``,
        ``len(x)``, a scalar parameter that sizes an axis, or a name every binding of
        which is one of these with the same key."""
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords:
            arg = node.args[0]
            if (self.bindings.builtin(node.func.id) is len and isinstance(arg, ast.Name) and arg.id in self.dims
                    and self.dims[arg.id]):
                return self.dims[arg.id][0]
            return None
        if isinstance(node, ast.Name):
            return self._name(node.id)
        return None

    def _subscript(self, node: ast.Subscript) -> DimKey | None:
        x = self.shape_of(node.value)
        if x is not None and isinstance(node.slice, ast.Constant) and type(node.slice.value) is int:
            k = node.slice.value
            if -len(self.dims[x]) <= k < len(self.dims[x]):
                return self.dims[x][k]
        return None

    def _name(self, name: str) -> DimKey | None:
        bindings = self.bindings.of.get(name)
        if bindings == [PARAM]:
            return ("scalar", name)
        if not bindings:
            return None
        keys = set()
        for b in bindings:
            if isinstance(b, Element):
                x = self.shape_of(b.source)
                key = self.dims[x][b.k] if x is not None and b.k < len(self.dims[x]) else None
            elif isinstance(b, ast.expr) and not (isinstance(b, ast.Name) and b.id == name):
                key = self.dim_of(b)
            else:
                key = None
            if key is None:
                return None
            keys.add(key)
        return keys.pop() if len(keys) == 1 else None
