"""Guard facts: what the tests around an access establish about its indices.

A tensor's sizes are known only at run time, so an index into a tensor parameter is
proven in bounds by the guard it sits under: ``if i < a.shape[0]:``, ``if i >= n:
return``, ``x if i < rows else 0``, ``for k in range(c.shape[0])``.  :class:`Guards`
turns a test into :class:`Fact` s (``i < size``, ``i >= 0``); the rewrite
(:mod:`pnex_magic.checking.rewrite`) keeps the facts that hold where it is, and
:meth:`Guards.tensor_in_bounds` asks them about each axis of an access.  The rules are
listed in :mod:`pnex_magic.checking.index_ranges`.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence

from .bindings import Bindings
from .intervals import Intervals
from .sizes import DimKey, TensorSizes
from ..kernelsource import range_call

__all__ = ["Fact", "Guards", "NEGATED", "int_constant", "plus_constant"]

#: each comparison's negation: ``not (a < b)`` is ``a >= b``
NEGATED = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt}


@dataclasses.dataclass(frozen=True)
class Fact:
    """What a guard establishes for a local name: ``name + offset < size`` (``kind`` "lt",
    ``dim`` the size's key) or ``name >= offset`` (``kind`` "ge0").  ``i < n - 1`` is
    ``i + 1 < n`` and ``0 < i`` is ``i >= 1``: a stencil's ``u[i + 1]`` and ``u[i - 1]``
    under ``if 0 < i < n - 1`` are proven."""

    name: str
    kind: str
    dim: DimKey | None = None
    offset: int = 0


def int_constant(node: ast.expr) -> int | None:
    """The value of an int constant written as ``3`` or ``-3``; ``None`` for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_constant(node.operand)
        return None if inner is None else -inner
    return None


def plus_constant(node: ast.expr) -> tuple[ast.expr, int]:
    """``(x, k)`` for ``x + k``, ``k + x`` or ``x - k`` (``k`` an int constant), else ``(node, 0)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        k = int_constant(node.right)
        if k is not None:
            return node.left, k if isinstance(node.op, ast.Add) else -k
        k = int_constant(node.left)
        if k is not None and isinstance(node.op, ast.Add):
            return node.right, k
    return node, 0


class Guards:
    """The facts a kernel's tests establish, and the tensor accesses they prove."""

    def __init__(self, bindings: Bindings, sizes: TensorSizes, intervals: Intervals):
        self.bindings = bindings
        self.sizes = sizes
        self.intervals = intervals

    def facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being true establishes (``a and b``: both; ``0 <= i < n``: each)."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return [f for v in test.values for f in self.facts(v)]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.exit_facts(test.operand)
        if isinstance(test, ast.Name):
            return self._flag_facts(test.id)
        if not isinstance(test, ast.Compare):
            return []
        found: list[Fact] = []
        operands = [test.left, *test.comparators]
        for left, op, right in zip(operands, test.ops, operands[1:]):
            if isinstance(op, (ast.Gt, ast.GtE)):  # b > a is a < b
                left, right, op = right, left, ast.Lt() if isinstance(op, ast.Gt) else ast.LtE()
            if not isinstance(op, (ast.Lt, ast.LtE)):
                continue
            strict = isinstance(op, ast.Lt)
            name, a = plus_constant(left)
            size, b = plus_constant(right)
            if isinstance(name, ast.Name):  # i + a < S + b: i + (a - b) < S (<=: one less)
                dim = self.sizes.dim_of(size)
                if dim is not None:
                    found.append(Fact(name.id, "lt", dim, a - b - (0 if strict else 1)))
            low = int_constant(left)
            name, a = plus_constant(right)
            if low is not None and isinstance(name, ast.Name):  # c < i + a: i >= c - a + 1 (<=: c - a)
                bound = low - a + (1 if strict else 0)
                if bound >= 0:
                    found.append(Fact(name.id, "ge0", offset=bound))
        return found

    def _flag_facts(self, flag: str) -> list[Fact]:
        """``if inside:`` where ``inside = 0 <= r < rows and ...`` was assigned once: the facts
        of that test, about names themselves assigned once and before it (so still true)."""
        at = self.bindings.once(flag)
        if at is None or flag in self.bindings.active:
            return []
        self.bindings.active.add(flag)
        try:
            facts = self.facts(self.bindings.of[flag][0])
        finally:
            self.bindings.active.discard(flag)
        once = self.bindings.once
        return [f for f in facts if (once(f.name) is not None and once(f.name) < at)]

    def exit_facts(self, test: ast.expr) -> list[Fact]:
        """What ``test`` being false establishes: the facts after ``if test: return``."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            return [f for v in test.values for f in self.exit_facts(v)]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.facts(test.operand)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            negated = NEGATED.get(type(test.ops[0]))
            if negated is not None:  # not (i >= n) is i < n; not (n <= i) is n > i
                return self.facts(ast.Compare(left=test.left, ops=[negated()], comparators=test.comparators))
        return []

    def loop_facts(self, loop: ast.For) -> list[Fact]:
        """What holds in the body of ``for i in range(...)``: ``i < stop`` when ``stop`` is
        a size and the step positive, ``i >= 0`` when ``start`` is non-negative too."""
        args = range_call(loop.iter)
        bounds = self.intervals.range_bounds(args) if args is not None and isinstance(loop.target, ast.Name) else None
        if bounds is None:
            return []
        name, (start, stop) = loop.target.id, bounds
        found = []
        dim = self.sizes.dim_of(stop)
        if dim is not None:
            found.append(Fact(name, "lt", dim))
        if start is None or self.intervals.magnitude(start) is not None:
            found.append(Fact(name, "ge0"))
        return found

    def tensor_in_bounds(self, name: str, parts: Sequence[ast.expr], facts: Sequence[Fact]) -> bool:
        """Whether indexing tensor parameter ``name`` with ``parts`` (one per axis) is
        proven in bounds by ``facts`` and the indices' magnitudes."""
        dims = self.sizes.dims.get(name)
        if dims is None or len(parts) != len(dims):
            return False
        return all(self._axis_in_bounds(part, dim, facts) for part, dim in zip(parts, dims))

    def _axis_in_bounds(self, part: ast.expr, dim: DimKey, facts: Sequence[Fact]) -> bool:
        """``part`` (``i``, ``i + d`` or ``i - d``) is in ``[0, size)``: ``i >= -d`` and
        ``i + k < size`` with ``k >= d`` (the magnitudes of cuda.grid and sizes, below
        2**48, leave no int64 overflow on the way)."""
        name, d = plus_constant(part)
        subject = name.id if isinstance(name, ast.Name) else None
        nonnegative = (d >= 0 and self.intervals.magnitude(name) is not None) or self.intervals.magnitude(part) is not None
        if not nonnegative and not any(f.name == subject and f.kind == "ge0" and f.offset + d >= 0 for f in facts):
            return False  # maybe negative
        if dim[0] == "const":
            known = self.intervals.interval(part)
            if known is not None and known.hi < dim[1]:
                return True
        return any(f.name == subject and f.kind == "lt" and f.dim == dim and f.offset >= d for f in facts)
