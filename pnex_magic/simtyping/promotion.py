"""When NumPy computes an operation as Numba does, and how few conversions make it.

The simulator holds a value as a NumPy scalar of its type, as a Python number
(a literal, a thread index, a shape, a loop index, a float64 from ``math.*``), or
as something else of the right value (:attr:`~.values.Val.rep`).  NumPy's rules
(NEP 50) decide the type of an operation on them: two NumPy scalars promote to the
larger type, a Python number takes the NumPy scalar's.  Where that gives exactly
Numba's computation (its signature's argument types, its result type, each operand
converted as Numba converts it), the operation needs no conversion: ``a[i] * k`` of
a float64 ``a`` and a Python ``int`` index does not, ``a[i] * 0.1`` of a float32 does
(NumPy would stay in float32).  :meth:`Promotion.conversions` finds the cheapest
choice (a literal is converted for free, to a typed constant; ``float()`` costs less
than a NumPy scalar; Python's own float arithmetic is IEEE double, the cheapest).
"""

from __future__ import annotations

import ast
import functools
import operator
from typing import Any

import numpy as np

from . import numba_types as T
from .values import Val, type_name

__all__ = ["Promotion", "numpy_computes", "numpy_result", "literal"]


@functools.lru_cache(maxsize=None)
def numpy_result(op: Any, left: str, right: str | None) -> np.dtype:
    """The dtype NumPy gives ``op`` of scalars of these dtypes (found by doing it)."""
    with np.errstate(all="ignore"):
        a = np.dtype(left).type(1)
        if right is None:
            return np.asarray(op(a)).dtype
        return np.asarray(op(a, np.dtype(right).type(1))).dtype


_SAMPLES = {"int": 3, "float": 1.5, "bool": True}
_ARITH = (operator.add, operator.sub, operator.mul)
_ORDER = (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)
#: What a Python number converts to, in NumPy's promotion with a NumPy scalar, exactly
#: as Numba converts it (a Python int to int64 or float64: in range, correctly rounded).
_WEAK_TARGETS = {"int": ("int64", "float64"), "float": ("float64",), "bool": ("int64", "float64", "bool"), "uint": ()}


@functools.lru_cache(maxsize=None)
def numpy_computes(fn: Any, left: tuple | None, right: tuple | None, args: tuple, result: str) -> str | None:
    """Whether ``fn`` of operands held as ``left``/``right`` (:attr:`Val.rep`) is
    computed by Python/NumPy exactly as Numba computes it with signature ``args``
    -> ``result``: ``"np"`` (NumPy converts both operands to ``args``' type, and its
    result has ``result``'s), ``"py"`` (two Python floats: IEEE double arithmetic, or
    a comparison of two Python numbers of one kind), else ``None``."""
    if left is None or right is None or args[0] != args[1]:
        return None
    if left[0] == "py" and right[0] == "py":
        floats = "float" in (left[1], right[1]) and {left[1], right[1]} <= {"float", "int", "bool"}
        if floats and args[0] == "float64" and result == "float64" and fn in _ARITH:
            return "py"  # IEEE double arithmetic; an int converted to the nearest double, as Numba does
        if fn in _ORDER and left[1] == right[1] and result == "bool" and (
                (left[1] == "float" and args[0] == "float64") or (left[1] == "int" and args[0].startswith("int"))):
            return "py"
        return None
    for rep in (left, right):
        if rep[0] == "py" and args[0] not in _WEAK_TARGETS[rep[1]]:
            return None
    a = np.dtype(left[1]).type(1) if left[0] == "np" else _SAMPLES[left[1]]
    b = np.dtype(right[1]).type(1) if right[0] == "np" else _SAMPLES[right[1]]
    with np.errstate(all="ignore"):
        try:
            common = np.add(a, b).dtype if not (left[1] == right[1] == "bool") else np.dtype(bool)
            got = np.asarray(fn(a, b)).dtype
        except Exception:  # noqa: BLE001 - NumPy refuses: not this way
            return None
    if str(common) != args[0] or str(got) != result:
        return None
    return "np"


def literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


class Promotion:
    """Choosing conversions: mixed into the expression walker."""

    em: Any

    def operands(self, fn: Any, arg_types: tuple, result: Any, items: list[tuple[ast.expr, Val]]
                 ) -> tuple[list[ast.expr], bool] | None:
        """The operands of ``fn``, converted as :meth:`conversions` chooses, and whether
        the result is a Python number (``None`` where no choice makes NumPy compute it)."""
        chosen = self.conversions(fn, arg_types, result, items)
        if chosen is None:
            return None
        how, py = chosen
        return [self.convert_as(n, v, arg_types[k], how[k]) for k, (n, v) in enumerate(items)], py

    def convert_as(self, node: ast.expr, val: Val, ty: Any, how: str) -> ast.expr:
        """``node`` kept (``"keep"``), converted to a NumPy scalar of ``ty`` (``"np"``)
        or to a Python float (``"py"``: a float64 value, by ``float()``)."""
        if how == "keep":
            return node
        if how == "np":
            return self.em.convert(node, val, ty)
        if isinstance(node, ast.Constant):
            return ast.copy_location(ast.Constant(value=float(node.value)), node)
        return self.em.call(self.em.helper(("builtin", "float"), "float"), [node], node)

    def conversions(self, fn: Any, arg_types: tuple, result: Any, items: list[tuple[ast.expr, Val]]
                    ) -> tuple[tuple[str, str], bool] | None:
        """How to convert each operand of ``fn`` (``"keep"``, ``"np"``: to a NumPy
        scalar of the signature's type ``arg_types``, ``"py"``: to a Python float, for
        float64) for Python/NumPy to compute it exactly as Numba does, at the least
        cost (a literal's conversion costs nothing: a typed constant; ``float()`` is
        cheaper than a NumPy scalar), and whether the result is then a Python number;
        ``None`` where no way does (the caller converts both)."""
        names = tuple(type_name(a) for a in arg_types)
        if not all(T.is_scalar(a) for a in arg_types) or any(T.is_bf16(a) for a in arg_types):
            return None
        choices = []
        for k, (n, v) in enumerate(items):
            ways = [("keep", 0.0, v.rep)]
            ways.append(("np", 0.0 if literal(n) else 1.0, ("np", names[k])))
            if names[k] == "float64" and v.scalar and not T.is_bf16(v.ty) and not (v.rep or ("",))[0] == "py":
                ways.append(("py", 0.3, ("py", "float")))
            choices.append(ways)
        best = None
        for left in choices[0]:
            for right in choices[1]:
                verdict = numpy_computes(fn, left[2], right[2], names, type_name(result))
                if verdict is None:
                    continue
                # What the operation itself costs: Python's float arithmetic least, NumPy's on
                # two scalars of one dtype (or one and a Python number) more, on two dtypes most.
                mixed = left[2][0] == right[2][0] == "np" and left[2][1] != right[2][1]
                cost = left[1] + right[1] + (0.1 if verdict == "py" else 1.0 if mixed else 0.4)
                if best is None or cost < best[0]:
                    best = (cost, (left[0], right[0]), verdict == "py")
        return None if best is None else (best[1], best[2])
